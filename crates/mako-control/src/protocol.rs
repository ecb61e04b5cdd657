//! The control protocol between the `mako` CLI and `makod`: requests, responses and
//! the plain data views the daemon reports.
//!
//! Wire format: one JSON object per line (UTF-8, `\n`-terminated), in both directions:
//!
//! ```text
//! {"v":1,"request":"status"}
//! {"v":1,"request":{"mount":{"fs":"fs1"}}}
//! {"v":1,"response":{"ok":{"message":"fs1 mounted on /mako/fs1"}}}
//! ```
//!
//! `v` is the protocol version. Each side checks it before reading the body and
//! refuses a different version with `ProtocolError::VersionMismatch`, whose message
//! says how to get matching binaries. Variant names are snake_case and are the stable
//! identifiers of the protocol: renaming one is a version change. A connection
//! carries any number of request/response pairs, strictly alternating.

use serde::{Deserialize, Serialize};

/// Version of this protocol; bump it on any incompatible change.
pub const PROTOCOL_VERSION: u64 = 1;

/// Longest accepted line, in bytes (requests and responses).
pub const LINE_BYTES_MAX: usize = 16 << 20;

/// Everything the CLI can ask the daemon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    /// Node, daemon and file system state → `Response::Status`.
    Status,
    /// Mount a file system defined in cluster.toml → `Ok`/`Error`: at `mountpoint` (an
    /// absolute path; `None`: its mount point in cluster.toml), with `options` as
    /// `mount -o` takes them (`mount_options`). A file system may be mounted at several
    /// mount points at once; `remount` in `options` changes the options of the mount
    /// at `mountpoint`.
    Mount {
        fs: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mountpoint: Option<String>,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        options: String,
    },
    /// Unmount a file system from `mountpoint`, or from every mount point → `Ok`/`Error`
    /// (the message names each mount point unmounted).
    Unmount {
        fs: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mountpoint: Option<String>,
    },
    /// Flush, unmount everything and exit → `Ok` (sent before the daemon exits).
    Shutdown,
    /// Write every dirty block and the logs → `Ok`.
    Sync,
    /// Drop clean cached blocks of one file system (or all) → `Ok`.
    ClearCache { fs: Option<String> },
    /// Change a configuration parameter in the running daemon → `Ok`/`Error`.
    /// `immediate` is what `-i` asked for; the CLI has already saved the value.
    ConfigSet {
        name: String,
        value: String,
        immediate: bool,
    },
    /// The last `last` I/O records → `Iohist`.
    DiagIohist { last: usize },
    /// Threads blocked at least `threshold_ms` → `Waiters`.
    DiagWaiters { threshold_ms: u64 },
    /// Lock contention counters → `Counters`.
    DiagCounters,
    /// Per file system and per disk counters → `Stats`.
    DiagStats,
    /// Tokens held → `Tokens`.
    DiagTokens,
    /// Effective configuration of the daemon → `Config`.
    DiagConfig,
    /// Check a mounted file system read-only (`mako fsck --online`) → `Fsck`.
    Fsck { fs: String, threads: usize },
    /// The replicated cluster configuration and every node's own account of itself
    /// (`mako node show`, `mako status` of a multi-process cluster) → `Cluster`.
    ClusterShow,
    /// Sets (`value` given) or unsets a parameter in the replicated configuration,
    /// cluster-wide (`nodes` empty) or for the named nodes only → `Ok`/`Error`.
    ClusterParam {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        nodes: Vec<String>,
    },
    /// Deletes a disk that no file system uses from the replicated configuration
    /// (`mako disk delete`) → `Ok`/`Error`. A disk the configuration does not have is
    /// `Ok` (deleted before), so a command interrupted half-way can be run again.
    ClusterDeleteDisk { name: String },
    /// Deletes a file system from the replicated configuration (`mako fs delete`; the
    /// CLI has checked that no node mounts it) → `Ok`/`Error`, `Ok` if it is not there.
    ClusterDeleteFs { name: String },
    /// Adds node `id` (`mako node add`) to the replicated configuration with `roles`
    /// (`client`, `manager`; a quorum role is refused) → `Ok`/`Error`.
    ClusterAddNode {
        id: u32,
        name: String,
        address: String,
        roles: Vec<String>,
    },
    /// Removes a node that is down, serves no disk and is no quorum node from the
    /// replicated configuration (`mako node remove`) → `Ok`/`Error`.
    ClusterRemoveNode { name: String },
}

impl Request {
    /// Short name for messages (`status`, `mount`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Request::Status => "status",
            Request::Mount { .. } => "mount",
            Request::Unmount { .. } => "unmount",
            Request::Shutdown => "shutdown",
            Request::Sync => "sync",
            Request::ClearCache { .. } => "clear_cache",
            Request::ConfigSet { .. } => "config_set",
            Request::DiagIohist { .. } => "diag_iohist",
            Request::DiagWaiters { .. } => "diag_waiters",
            Request::DiagCounters => "diag_counters",
            Request::DiagStats => "diag_stats",
            Request::DiagTokens => "diag_tokens",
            Request::DiagConfig => "diag_config",
            Request::Fsck { .. } => "fsck",
            Request::ClusterShow => "cluster_show",
            Request::ClusterParam { .. } => "cluster_param",
            Request::ClusterDeleteDisk { .. } => "cluster_delete_disk",
            Request::ClusterDeleteFs { .. } => "cluster_delete_fs",
            Request::ClusterAddNode { .. } => "cluster_add_node",
            Request::ClusterRemoveNode { .. } => "cluster_remove_node",
        }
    }
}

/// Everything the daemon answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    /// Done; `message` is shown to the administrator.
    Ok {
        message: String,
    },
    /// Refused or failed; `message` says what, where and what to do.
    Error {
        message: String,
    },
    Status(DaemonStatus),
    Iohist(Vec<IoRecordView>),
    Waiters(Vec<WaiterView>),
    Counters(Vec<LockCounterView>),
    Stats(StatsView),
    Tokens(Vec<TokenView>),
    Config(Vec<ConfigRowView>),
    Fsck(FsckView),
    Cluster(ClusterView),
}

/// `Response::Cluster`: the replicated configuration as the answering node has
/// applied it, and what every node says about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The node that answered.
    pub answered_by: String,
    /// Empty until the cluster's configuration is created.
    pub name: String,
    /// The configuration's epoch on the answering node.
    pub epoch: u64,
    /// The cluster manager (raft leader) the answering node knows of.
    pub manager: Option<String>,
    pub nodes: Vec<NodeStateView>,
    pub disks: Vec<ClusterDiskView>,
    pub filesystems: Vec<ClusterFsView>,
    /// Parameter settings: (name, value, `cluster` or the node names).
    pub params: Vec<(String, String, String)>,
}

/// One node in `ClusterView`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStateView {
    pub id: u32,
    pub name: String,
    /// `quorum`, `manager`, `client`, comma-separated.
    pub roles: String,
    pub address: String,
    /// `leader`, `follower`, `learner`, `candidate`, or why the node did not answer
    /// (`not running`, `unreachable: …`).
    pub state: String,
    /// True if the node answered.
    pub answers: bool,
    pub term: u64,
    /// The configuration epoch the node has applied.
    pub epoch: u64,
}

/// One disk in `ClusterView`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterDiskView {
    pub name: String,
    pub size_bytes: u64,
    /// NSD server names, primary first; empty when every node reaches the disk.
    pub servers: Vec<String>,
    pub failure_group: i32,
    pub pool: String,
}

/// One file system in `ClusterView`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterFsView {
    pub name: String,
    pub disks: Vec<String>,
}

/// What an online check found: its e2fsck-style exit code and the report, as text and
/// as JSON (the CLI prints one of them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FsckView {
    pub exit_code: i32,
    pub text: String,
    pub json: String,
}

impl Response {
    /// Short name for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Response::Ok { .. } => "ok",
            Response::Error { .. } => "error",
            Response::Status(_) => "status",
            Response::Iohist(_) => "iohist",
            Response::Waiters(_) => "waiters",
            Response::Counters(_) => "counters",
            Response::Stats(_) => "stats",
            Response::Tokens(_) => "tokens",
            Response::Config(_) => "config",
            Response::Fsck(_) => "fsck",
            Response::Cluster(_) => "cluster",
        }
    }

    /// An `Error` response.
    pub fn error(message: impl Into<String>) -> Self {
        Response::Error {
            message: message.into(),
        }
    }

    /// An `Ok` response.
    pub fn ok(message: impl Into<String>) -> Self {
        Response::Ok {
            message: message.into(),
        }
    }
}

/// `Response::Status`: the daemon and its file systems.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DaemonStatus {
    pub node_name: String,
    pub node_id: u32,
    pub pid: u32,
    pub data_dir: String,
    pub uptime_secs: u64,
    /// makod's version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// Every file system of cluster.toml, mounted or not.
    pub filesystems: Vec<FsStatus>,
}

/// One file system in `DaemonStatus`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FsStatus {
    pub name: String,
    pub mountpoint: String,
    pub mounted: bool,
    pub block_bytes: u64,
    pub subblock_bytes: u64,
    pub inode_bytes: u64,
    /// Allocatable bytes over all disks.
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub inodes_used: u64,
    pub inodes_max: u64,
    pub pagepool_bytes: u64,
    pub pagepool_used_bytes: u64,
    pub pagepool_dirty_bytes: u64,
    pub read_only: bool,
    pub disks: Vec<DiskStatusView>,
    /// Every mount point the file system is mounted at, with its options.
    #[serde(default)]
    pub mounts: Vec<MountView>,
}

/// One mount point of a file system in `FsStatus`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MountView {
    pub mountpoint: String,
    /// The canonical options (`rw,nosuid,relatime`), as `MountOptions` prints them.
    pub options: String,
}

/// One disk in `FsStatus`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiskStatusView {
    pub name: String,
    pub path: String,
    pub size_bytes: u64,
    pub free_bytes: u64,
    pub pool: String,
    pub failure_group: i32,
    /// `dataAndMetadata`, `dataOnly`, `metadataOnly`, `descOnly`.
    pub usage: String,
    /// `ready`, `suspended`, `down`, …
    pub status: String,
}

/// One I/O of `mako diag iohist`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IoRecordView {
    /// When the I/O was started, microseconds since the Unix epoch.
    pub start_unix_micros: u64,
    pub write: bool,
    /// `data`, `inode`, `indBlock`, `dirBlock`, `allocMap`, `logData`, `desc`, …
    pub buffer_type: String,
    /// Disk index in the file system (the `disk` of `disk:sector`).
    pub disk: u32,
    /// First 512-byte sector.
    pub sector: u64,
    /// Sectors transferred.
    pub sectors: u64,
    /// Device service time.
    pub service_ms: f64,
    /// Time queued before the device saw it.
    pub queue_ms: f64,
    /// Name of the thread that issued it.
    pub thread: String,
    /// Inode the I/O was for, if known.
    pub ino: Option<u64>,
    /// False if the I/O failed.
    pub ok: bool,
}

/// One blocked thread of `mako diag waiters`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WaiterView {
    pub thread: String,
    pub waiting_ms: f64,
    /// What it waits for, e.g. `token inode 1234 mode wx from node 2`.
    pub what: String,
}

/// One lock of `mako diag counters`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LockCounterView {
    pub name: String,
    pub acquisitions: u64,
    pub contended: u64,
    pub wait_total_ms: f64,
    pub wait_max_ms: f64,
}

/// `mako diag stats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsView {
    pub filesystems: Vec<FsCountersView>,
    pub disks: Vec<DiskCountersView>,
}

/// Named counters of one file system (e.g. `("reads", 10)`, `("bytes_read", 4096)`),
/// in the order the daemon wants them shown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FsCountersView {
    pub name: String,
    pub counters: Vec<(String, u64)>,
}

/// I/O counters of one disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiskCountersView {
    pub name: String,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_ms_avg: f64,
    pub write_ms_avg: f64,
    pub errors: u64,
}

/// One token of `mako diag tokens`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenView {
    /// The resource, e.g. `fs1 inode 1234 bytes 0..4M`.
    pub resource: String,
    /// The manager node whose token manager shard keeps it (its name; empty for a
    /// makod that is the whole cluster).
    #[serde(default)]
    pub manager: String,
    /// Holders with their modes, e.g. `node1 rw`.
    pub holders: Vec<String>,
}

/// One parameter of `mako diag config` (the daemon's effective configuration).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfigRowView {
    pub name: String,
    pub value: String,
    /// `default`, `cluster config`, `command line`, `immediate (-i)`.
    pub source: String,
    pub default: String,
    pub range: String,
    /// `immediate` or `restart`.
    pub apply: String,
}

/// A line that could not be understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The peer speaks another protocol version (or none).
    #[error(
        "control protocol version mismatch: the other side speaks {}, this side speaks v{ours}; \
         the mako CLI and makod come from different builds: run `mako down`, install \
         matching binaries, then `mako up`",
        theirs.map_or("no version".to_string(), |v| format!("v{v}"))
    )]
    VersionMismatch {
        /// The peer's version, `None` if the line had no `v`.
        theirs: Option<u64>,
        /// This side's version.
        ours: u64,
    },
    /// Not a JSON object, or not a known request/response.
    #[error("malformed control message: {detail}")]
    Malformed { detail: String },
}

#[derive(Serialize)]
struct OutgoingRequest<'a> {
    v: u64,
    request: &'a Request,
}

#[derive(Serialize)]
struct OutgoingResponse<'a> {
    v: u64,
    response: &'a Response,
}

/// One line (without the `\n`) carrying `request`.
pub fn encode_request(request: &Request) -> String {
    serde_json::to_string(&OutgoingRequest {
        v: PROTOCOL_VERSION,
        request,
    })
    .unwrap_or_else(|e| unreachable!("a Request always serializes: {e}"))
}

/// One line (without the `\n`) carrying `response`.
pub fn encode_response(response: &Response) -> String {
    serde_json::to_string(&OutgoingResponse {
        v: PROTOCOL_VERSION,
        response,
    })
    .unwrap_or_else(|e| unreachable!("a Response always serializes: {e}"))
}

/// Reads a request line; checks the version first.
pub fn decode_request(line: &str) -> Result<Request, ProtocolError> {
    decode_body(line, "request")
}

/// Reads a response line; checks the version first.
pub fn decode_response(line: &str) -> Result<Response, ProtocolError> {
    decode_body(line, "response")
}

fn decode_body<T: serde::de::DeserializeOwned>(
    line: &str,
    field: &str,
) -> Result<T, ProtocolError> {
    let malformed = |detail: String| ProtocolError::Malformed { detail };
    let value: serde_json::Value =
        serde_json::from_str(line.trim_end()).map_err(|e| malformed(format!("not JSON ({e})")))?;
    let serde_json::Value::Object(mut object) = value else {
        return Err(malformed("expected a JSON object".to_string()));
    };
    match object.get("v").and_then(serde_json::Value::as_u64) {
        Some(PROTOCOL_VERSION) => {}
        theirs => {
            return Err(ProtocolError::VersionMismatch {
                theirs,
                ours: PROTOCOL_VERSION,
            })
        }
    }
    let body = object
        .remove(field)
        .ok_or_else(|| malformed(format!("no `{field}` field")))?;
    serde_json::from_value(body).map_err(|e| malformed(format!("unknown or invalid {field}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_status() -> DaemonStatus {
        DaemonStatus {
            node_name: "node1".into(),
            node_id: 1,
            pid: 4242,
            data_dir: "/var/lib/mako".into(),
            uptime_secs: 3725,
            version: "0.1.0".into(),
            filesystems: vec![FsStatus {
                name: "fs1".into(),
                mountpoint: "/mako/fs1".into(),
                mounted: true,
                block_bytes: 4 << 20,
                subblock_bytes: 8 << 10,
                inode_bytes: 4096,
                total_bytes: 32 << 30,
                free_bytes: 30 << 30,
                inodes_used: 12,
                inodes_max: 1 << 20,
                pagepool_bytes: 1 << 30,
                pagepool_used_bytes: 10 << 20,
                pagepool_dirty_bytes: 0,
                read_only: false,
                mounts: Vec::new(),
                disks: vec![DiskStatusView {
                    name: "d0".into(),
                    path: "/var/lib/mako/disks/d0.img".into(),
                    size_bytes: 8 << 30,
                    free_bytes: 7 << 30,
                    pool: "system".into(),
                    failure_group: 1,
                    usage: "dataAndMetadata".into(),
                    status: "ready".into(),
                }],
            }],
        }
    }

    fn all_requests() -> Vec<Request> {
        vec![
            Request::Status,
            Request::Mount {
                fs: "fs1".into(),
                mountpoint: None,
                options: String::new(),
            },
            Request::Unmount {
                fs: "fs1".into(),
                mountpoint: Some("/tmp/x".into()),
            },
            Request::Shutdown,
            Request::Sync,
            Request::ClearCache { fs: None },
            Request::ClearCache {
                fs: Some("fs1".into()),
            },
            Request::ConfigSet {
                name: "maxMBpS".into(),
                value: "4096".into(),
                immediate: true,
            },
            Request::DiagIohist { last: 20 },
            Request::DiagWaiters { threshold_ms: 100 },
            Request::DiagCounters,
            Request::DiagStats,
            Request::DiagTokens,
            Request::DiagConfig,
            Request::Fsck {
                fs: "fs1".into(),
                threads: 2,
            },
        ]
    }

    fn all_responses() -> Vec<Response> {
        vec![
            Response::ok("done"),
            Response::error("no such file system `fs9`"),
            Response::Fsck(FsckView {
                exit_code: 0,
                text: "No problems found.\n".into(),
                json: "{}".into(),
            }),
            Response::Status(sample_status()),
            Response::Iohist(vec![IoRecordView {
                start_unix_micros: 1_700_000_000_123_456,
                write: true,
                buffer_type: "data".into(),
                disk: 2,
                sector: 81920,
                sectors: 8192,
                service_ms: 1.25,
                queue_ms: 0.5,
                thread: "prefetch-3".into(),
                ino: Some(1234),
                ok: true,
            }]),
            Response::Waiters(vec![WaiterView {
                thread: "fuse-1".into(),
                waiting_ms: 123.5,
                what: "token inode 7".into(),
            }]),
            Response::Counters(vec![LockCounterView {
                name: "pagepool".into(),
                acquisitions: 10,
                contended: 1,
                wait_total_ms: 0.5,
                wait_max_ms: 0.5,
            }]),
            Response::Stats(StatsView {
                filesystems: vec![FsCountersView {
                    name: "fs1".into(),
                    counters: vec![("reads".into(), 10), ("writes".into(), 3)],
                }],
                disks: vec![DiskCountersView {
                    name: "d0".into(),
                    reads: 1,
                    writes: 2,
                    read_bytes: 4096,
                    write_bytes: 8192,
                    read_ms_avg: 0.25,
                    write_ms_avg: 0.5,
                    errors: 0,
                }],
            }),
            Response::Tokens(vec![TokenView {
                resource: "fs1 inode 7".into(),
                manager: "node0".into(),
                holders: vec!["node1 rw".into()],
            }]),
            Response::Config(vec![ConfigRowView {
                name: "pagepool".into(),
                value: "1G".into(),
                source: "cluster config".into(),
                default: "4G".into(),
                range: "64M..256G".into(),
                apply: "restart".into(),
            }]),
        ]
    }

    #[test]
    fn every_request_round_trips() {
        for request in all_requests() {
            let line = encode_request(&request);
            assert!(!line.contains('\n'), "{line}");
            assert!(line.starts_with("{\"v\":1,"), "{line}");
            assert_eq!(decode_request(&line).unwrap(), request, "{line}");
        }
    }

    #[test]
    fn every_response_round_trips() {
        for response in all_responses() {
            let line = encode_response(&response);
            assert!(!line.contains('\n'), "{line}");
            assert_eq!(decode_response(&line).unwrap(), response, "{line}");
        }
    }

    #[test]
    fn wire_shape_is_stable() {
        assert_eq!(
            encode_request(&Request::Status),
            r#"{"v":1,"request":"status"}"#
        );
        assert_eq!(
            encode_request(&Request::Mount {
                fs: "fs1".into(),
                mountpoint: None,
                options: String::new(),
            }),
            r#"{"v":1,"request":{"mount":{"fs":"fs1"}}}"#
        );
        assert_eq!(
            encode_response(&Response::ok("x")),
            r#"{"v":1,"response":{"ok":{"message":"x"}}}"#
        );
    }

    #[test]
    fn version_mismatch_is_a_clear_error() {
        let error = decode_request(r#"{"v":2,"request":"status"}"#).unwrap_err();
        assert_eq!(
            error,
            ProtocolError::VersionMismatch {
                theirs: Some(2),
                ours: 1
            }
        );
        let message = error.to_string();
        assert!(message.contains("speaks v2"), "{message}");
        assert!(message.contains("this side speaks v1"), "{message}");
        assert!(message.contains("mako down"), "{message}");
        let error = decode_response(r#"{"response":{"ok":{"message":"x"}}}"#).unwrap_err();
        assert!(error.to_string().contains("speaks no version"), "{error}");
    }

    #[test]
    fn malformed_lines_are_errors() {
        for line in [
            "",
            "garbage",
            "[1,2]",
            "{\"v\":1}",
            "{\"v\":1,\"request\":\"explode\"}",
            "{\"v\":1,\"request\":{\"mount\":{}}}",
            "{\"v\":1,\"request\":{\"mount\":{\"fs\":7}}}",
            "\u{0}\u{1}",
        ] {
            match decode_request(line) {
                Err(ProtocolError::Malformed { .. }) => {}
                other => panic!("{line:?}: {other:?}"),
            }
        }
    }
}
