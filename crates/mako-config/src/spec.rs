//! The registry of every configuration parameter: name (the seeds' spelling), kind and
//! range, default, scope, whether `-i` can change it in a running daemon, and what it
//! does.
//!
//! `PARAMS` is ordered like [`ParamId`]; the order, the uniqueness of names and the
//! fact that every fixed default lies inside its range are checked at compile time by
//! `check_registry`. Relations between parameters live in `relations.rs`.

use crate::error::{ConfigError, Result};
use crate::value::Value;

/// One kibibyte. All size suffixes in Mako are binary, as in GPFS.
pub const KIB: u64 = 1024;
/// One mebibyte.
pub const MIB: u64 = 1024 * KIB;
/// One gibibyte.
pub const GIB: u64 = 1024 * MIB;
/// One tebibyte.
pub const TIB: u64 = 1024 * GIB;
/// One pebibyte.
pub const PIB: u64 = 1024 * TIB;

/// Milliseconds per second, for writing time limits readably.
const SEC_MS: u64 = 1000;

// --- Limits. Names end with their unit; relations between them are asserted below. ---

/// Largest file system block size (DESIGN.md section 1: 64 KiB–16 MiB).
pub const BLOCK_SIZE_BYTES_MAX: u64 = 16 * MIB;
/// Kernel page size assumed for FUSE request sizes.
pub const FUSE_PAGE_BYTES: u64 = 4 * KIB;

/// Smallest accepted `pagepool`.
pub const PAGEPOOL_BYTES_MIN: u64 = 64 * MIB;
/// Largest accepted `pagepool`.
pub const PAGEPOOL_BYTES_MAX: u64 = 256 * GIB;
/// The computed `pagepool` default never exceeds this.
pub const PAGEPOOL_DEFAULT_BYTES_CAP: u64 = 4 * GIB;
/// Share of physical memory the computed `pagepool` default takes.
pub const PAGEPOOL_DEFAULT_RAM_PERCENT: u64 = 25;
/// Physical memory assumed when the operating system cannot tell us.
pub const PAGEPOOL_FALLBACK_RAM_BYTES: u64 = 4 * GIB;

/// Smallest accepted `fuseMaxWrite`.
pub const FUSE_MAX_WRITE_BYTES_MIN: u64 = 128 * KIB;
/// Largest accepted `fuseMaxWrite`.
pub const FUSE_MAX_WRITE_BYTES_MAX: u64 = 16 * MIB;
/// Default `fuseMaxWrite`: a whole default block (4 MiB) per request. DESIGN.md
/// section 5 asks for at least 1 MiB; measured here, 4 MiB requests stream writes
/// 20-40% faster than 1 MiB ones and reads at the same rate. makod raises the kernel's
/// max_pages_limit to allow it (root, Linux 6.13+); otherwise the kernel's limit is used.
pub const FUSE_MAX_WRITE_BYTES_DEFAULT: u64 = 4 * MIB;

/// Smallest accepted `dioSmallSeqWriteThreshold` (one sector).
pub const DIO_SMALL_SEQ_WRITE_THRESHOLD_BYTES_MIN: u64 = 512;
/// Largest accepted `dioSmallSeqWriteThreshold`.
pub const DIO_SMALL_SEQ_WRITE_THRESHOLD_BYTES_MAX: u64 = 128 * KIB;
/// Default `dioSmallSeqWriteThreshold` (the seeds: "default is 64K").
pub const DIO_SMALL_SEQ_WRITE_THRESHOLD_BYTES_DEFAULT: u64 = 64 * KIB;

/// Directory block size in the seeds' directory-listing example (256 KiB blocks sent
/// as small messages); the small-message threshold default must cover one.
pub const SEED_DIRECTORY_BLOCK_BYTES: u64 = 256 * KIB;
/// Default `tscSmallMsgSizeThreshold` (the seeds: "The default is 512 KiB").
pub const TSC_SMALL_MSG_SIZE_THRESHOLD_BYTES_DEFAULT: u64 = 512 * KIB;

/// Default `fuseDirectIoFileSize`: files of at least 64 MiB are streamed past the
/// kernel page cache.
pub const FUSE_DIRECT_IO_FILE_SIZE_DEFAULT: u64 = 64 * MIB;
/// Largest `fuseDirectIoFileSize`, 1024T: in effect, no file by its size.
pub const FUSE_DIRECT_IO_FILE_SIZE_MAX: u64 = 1 << 50;

/// Largest `prefetchPartitions`.
pub const PREFETCH_PARTITIONS_MAX: i64 = 64;
/// Smallest `prefetchThreads`.
pub const PREFETCH_THREADS_MIN: i64 = 2;
/// Largest `prefetchThreads`.
pub const PREFETCH_THREADS_MAX: i64 = 1024;
/// Default `prefetchThreads`.
pub const PREFETCH_THREADS_DEFAULT: i64 = 32;

/// Default `failureDetectionTime` (the seeds: lease duration of 35 seconds).
pub const FAILURE_DETECTION_TIME_MS_DEFAULT: u64 = 35 * SEC_MS;
/// Default `minMissedPingTimeout`.
pub const MIN_MISSED_PING_TIMEOUT_MS_DEFAULT: u64 = 3 * SEC_MS;
/// Smallest `failureDetectionTime`: 5 s. The lease invariant (a node's lease ends
/// before the manager may expel it) holds for any duration; what bounds it from below
/// is the cluster manager's own failover: a raft election takes up to 3 s (the
/// largest election timeout) and a node renews every fifth of the lease, so a lease of
/// 5 s still survives an election (3 s) plus a renewal interval (1 s) plus a second of
/// slack without fencing healthy nodes. GPFS's minimum is 10 s; the short one is for
/// tests (the kill -9 rounds of `failover_on_mako`) and small, quiet clusters.
pub const FAILURE_DETECTION_TIME_MS_MIN: u64 = 5 * SEC_MS;
/// Largest `minMissedPingTimeout`.
pub const MIN_MISSED_PING_TIMEOUT_MS_MAX: u64 = 300 * SEC_MS;

/// Default `maxTcpConnsPerNodeConn`.
pub const MAX_TCP_CONNS_PER_NODE_CONN_DEFAULT: i64 = 2;
/// Default `tscSmallMsgTcpConnPct`.
pub const TSC_SMALL_MSG_TCP_CONN_PCT_DEFAULT: i64 = 50;
/// Default `tscTcpPort`: GPFS's registered daemon port.
pub const TSC_TCP_PORT_DEFAULT: i64 = 1191;

// A pagepool of the minimum size must still hold several full blocks and several
// maximum-size FUSE requests in flight, or write-behind and prefetch cannot overlap.
const _: () = assert!(PAGEPOOL_BYTES_MIN >= 4 * BLOCK_SIZE_BYTES_MAX);
const _: () = assert!(PAGEPOOL_BYTES_MIN >= 4 * FUSE_MAX_WRITE_BYTES_MAX);
const _: () = assert!(PAGEPOOL_DEFAULT_BYTES_CAP >= PAGEPOOL_BYTES_MIN);
const _: () = assert!(PAGEPOOL_DEFAULT_BYTES_CAP <= PAGEPOOL_BYTES_MAX);
// FUSE request sizes are whole pages.
const _: () = assert!(FUSE_MAX_WRITE_BYTES_MIN % FUSE_PAGE_BYTES == 0);
const _: () = assert!(FUSE_MAX_WRITE_BYTES_DEFAULT % FUSE_PAGE_BYTES == 0);
// A "small" direct write held for batching always arrives in one FUSE request, whatever
// fuseMaxWrite is; a larger write has already been split by the kernel and is not small.
const _: () = assert!(DIO_SMALL_SEQ_WRITE_THRESHOLD_BYTES_MAX <= FUSE_MAX_WRITE_BYTES_MIN);
// The small-message class must include a whole directory block, the seeds' motivating
// case (`ls -l` of a large directory behind a streaming read).
const _: () = assert!(TSC_SMALL_MSG_SIZE_THRESHOLD_BYTES_DEFAULT >= SEED_DIRECTORY_BLOCK_BYTES);
// Every prefetch partition needs at least one prefetch thread: the largest partition
// count fits the largest thread count, and the defaults satisfy the runtime relation.
const _: () = assert!(PREFETCH_PARTITIONS_MAX <= PREFETCH_THREADS_MAX);
const _: () = assert!(1 <= PREFETCH_THREADS_DEFAULT);
// The ping timeout must fit inside the lease (runtime relation), also for the defaults.
const _: () = assert!(MIN_MISSED_PING_TIMEOUT_MS_DEFAULT <= FAILURE_DETECTION_TIME_MS_DEFAULT);
const _: () = assert!(MIN_MISSED_PING_TIMEOUT_MS_MAX >= FAILURE_DETECTION_TIME_MS_MIN);
// With the default connection count, the default percentage reserves at least one
// connection for small messages (DESIGN.md section 6).
const _: () =
    assert!(MAX_TCP_CONNS_PER_NODE_CONN_DEFAULT * TSC_SMALL_MSG_TCP_CONN_PCT_DEFAULT / 100 >= 1);

/// Where a parameter's value is meant to be set and how far it reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// May differ from node to node (caches, threads, local services).
    Node,
    /// Must be the same on every node of the cluster (leases, connection protocol,
    /// on-disk layout decisions every node must agree on).
    Cluster,
    /// Read once when a file system is created; later changes affect only new file
    /// systems. No parameter uses this yet; mkfs options will.
    FileSystemCreate,
}

impl Scope {
    /// Human description for `mako config explain`.
    pub fn describe(self) -> &'static str {
        match self {
            Scope::Node => "per node (may differ between nodes)",
            Scope::Cluster => "cluster-wide (keep it the same on every node)",
            Scope::FileSystemCreate => "read when a file system is created",
        }
    }
}

/// When a changed value takes effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Apply {
    /// May be changed in a running daemon with `mako config set -i`.
    Immediate,
    /// Read only at daemon start; takes effect at the next `mako down`/`mako up`.
    Restart,
}

impl Apply {
    /// Human description for `mako config explain`.
    pub fn describe(self) -> &'static str {
        match self {
            Apply::Immediate => "immediately with -i, or at the next start",
            Apply::Restart => "at the next `mako down`/`mako up` only",
        }
    }
}

/// The unit a bare number means for a time parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeUnit {
    /// A bare number is seconds (`failureDetectionTime=60` as in the seeds).
    Seconds,
    /// A bare number is milliseconds (parameters whose name ends in `Millis`).
    Millis,
}

impl TimeUnit {
    /// Milliseconds per unit.
    pub const fn millis(self) -> u64 {
        match self {
            TimeUnit::Seconds => SEC_MS,
            TimeUnit::Millis => 1,
        }
    }

    /// Plural name of the unit.
    pub fn name(self) -> &'static str {
        match self {
            TimeUnit::Seconds => "seconds",
            TimeUnit::Millis => "milliseconds",
        }
    }
}

/// The type and the allowed range of a parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A size in bytes: `64K`, `4M`, `1.5G`, `1048576`; suffixes K/M/G/T are binary and
    /// case-insensitive, with or without a trailing `B` or `iB`.
    Bytes {
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
        /// The value must be a multiple of this (1 = any byte count).
        multiple_of: u64,
    },
    /// A whole number; `K`/`M`/`G` multiply by powers of 1024 (the seeds write
    /// `maxFilesToCache=128K`).
    Int {
        /// Smallest accepted value.
        min: i64,
        /// Largest accepted value.
        max: i64,
    },
    /// `yes`/`no` (also `true`/`false`, `on`/`off`, `1`/`0`); shown as `yes`/`no`.
    Bool,
    /// One of a fixed set of words, matched case-insensitively and stored in the
    /// spelling listed here.
    Enum(&'static [&'static str]),
    /// A duration kept in milliseconds: `500ms`, `35s`, `2m`, `1h`; a bare number is in
    /// the unit `bare`.
    Millis {
        /// Smallest accepted value in milliseconds.
        min: u64,
        /// Largest accepted value in milliseconds.
        max: u64,
        /// What a number without a suffix means.
        bare: TimeUnit,
    },
    /// An IPv4 or IPv6 address, stored in its canonical text form.
    IpAddr,
}

/// A parameter's default value.
#[derive(Clone, Copy, Debug)]
pub enum DefaultValue {
    /// A fixed size in bytes.
    Bytes(u64),
    /// A fixed whole number.
    Int(i64),
    /// A fixed boolean.
    Bool(bool),
    /// A fixed word or address.
    Text(&'static str),
    /// A fixed duration in milliseconds.
    Millis(u64),
    /// Computed from the machine when the configuration is resolved.
    Computed {
        /// Computes the value; its result is checked against the range by tests.
        compute: fn() -> Value,
        /// The rule in words, for `mako config explain`.
        rule: &'static str,
    },
}

impl DefaultValue {
    /// The default as a value (computing it if needed).
    pub fn value(&self) -> Value {
        match *self {
            DefaultValue::Bytes(v) => Value::Bytes(v),
            DefaultValue::Int(v) => Value::Int(v),
            DefaultValue::Bool(v) => Value::Bool(v),
            DefaultValue::Text(v) => Value::Text(v.to_string()),
            DefaultValue::Millis(v) => Value::Millis(v),
            DefaultValue::Computed { compute, .. } => compute(),
        }
    }

    /// The rule of a computed default, if this default is computed.
    pub fn rule(&self) -> Option<&'static str> {
        match self {
            DefaultValue::Computed { rule, .. } => Some(rule),
            _ => None,
        }
    }
}

/// Stable identifier of every parameter; `PARAMS[id as usize].id == id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(usize)]
#[allow(missing_docs)]
pub enum ParamId {
    Pagepool,
    MaxFilesToCache,
    MaxStatCache,
    WorkerThreads,
    MaxMBpS,
    PrefetchAggressivenessRead,
    PrefetchLargeBlockThreshold,
    PrefetchPartitions,
    PrefetchThreads,
    AvoidDirFragments,
    DirPreSplitLevels,
    DioSmallSeqWriteBatching,
    DioSmallSeqWriteThreshold,
    FuseMaxWrite,
    FuseWritebackCache,
    FuseIoUring,
    FuseDirectIoFileSize,
    FailureDetectionTime,
    MinMissedPingTimeout,
    MaxTcpConnsPerNodeConn,
    TscSmallMsgSizeThreshold,
    TscSmallMsgTcpConnPct,
    AllToAllConnection,
    IdleSocketTimeout,
    TscTcpPort,
    PrometheusPort,
    PrometheusAddress,
    IohistSize,
    WaiterThresholdMillis,
}

/// Number of parameters.
pub const PARAM_COUNT: usize = ParamId::WaiterThresholdMillis as usize + 1;

impl ParamId {
    /// The parameter's registry entry.
    pub fn spec(self) -> &'static ParamSpec {
        &PARAMS[self as usize]
    }

    /// The parameter's name in the seeds' spelling.
    pub fn name(self) -> &'static str {
        self.spec().name
    }
}

/// One configuration parameter.
#[derive(Clone, Copy, Debug)]
pub struct ParamSpec {
    /// Identifier; equals the entry's position in `PARAMS`.
    pub id: ParamId,
    /// Name in the seeds' spelling; lookups are case-sensitive.
    pub name: &'static str,
    /// Type and allowed range.
    pub kind: ParamKind,
    /// Default value.
    pub default: DefaultValue,
    /// Where it is set and how far it reaches.
    pub scope: Scope,
    /// Whether a running daemon accepts a change.
    pub apply: Apply,
    /// What the number counts, in words ("bytes", "threads", "MB/s", ...).
    pub unit: &'static str,
    /// What it does, when to change it, and its effect.
    pub doc: &'static str,
}

/// Accepted `allToAllConnection` values, in the seeds' spelling plus `no`.
pub const ALL_TO_ALL_CONNECTION_CHOICES: &[&str] = &["no", "local", "remote", "all"];

/// Computes the `pagepool` default: 25% of physical memory, at most 4 GiB and at least
/// the minimum, rounded down to whole MiB so that it prints readably.
pub fn pagepool_default() -> Value {
    let ram = physical_memory_bytes().unwrap_or(PAGEPOOL_FALLBACK_RAM_BYTES);
    let quarter = ram / 100 * PAGEPOOL_DEFAULT_RAM_PERCENT;
    let bytes = quarter.clamp(PAGEPOOL_BYTES_MIN, PAGEPOOL_DEFAULT_BYTES_CAP) / MIB * MIB;
    Value::Bytes(bytes)
}

/// Physical memory of this machine, or `None` if the operating system does not say.
pub fn physical_memory_bytes() -> Option<u64> {
    // SAFETY: sysconf only reads system information and has no preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: as above.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let pages = u64::try_from(pages).ok()?;
    let page_size = u64::try_from(page_size).ok()?;
    pages.checked_mul(page_size).filter(|&bytes| bytes > 0)
}

const PARAM_TABLE: &[ParamSpec] = &[
    ParamSpec {
        id: ParamId::Pagepool,
        name: "pagepool",
        kind: ParamKind::Bytes {
            min: PAGEPOOL_BYTES_MIN,
            max: PAGEPOOL_BYTES_MAX,
            multiple_of: 1,
        },
        default: DefaultValue::Computed {
            compute: pagepool_default,
            rule: "25% of physical memory, at most 4G, at least 64M",
        },
        scope: Scope::Node,
        apply: Apply::Restart,
        unit: "bytes",
        doc: "The daemon's own cache of file data and metadata blocks; write-behind, \
              prefetch and direct-I/O bounce buffers also come from it. Raise it on \
              nodes whose workloads reread data that fits in memory; a larger pool does \
              little for a single streaming reader once full-block prefetch is covered. \
              The seeds set 25% of real memory and advise against more than 32G even on \
              large servers; Mako's default is 25% of memory capped at 4G. The pool is \
              allocated at start, so a change needs a restart.",
    },
    ParamSpec {
        id: ParamId::MaxFilesToCache,
        name: "maxFilesToCache",
        kind: ParamKind::Int {
            min: 16,
            max: 100_000_000,
        },
        default: DefaultValue::Int(4000),
        scope: Scope::Node,
        apply: Apply::Restart,
        unit: "files",
        doc: "How many different files (full inodes with their tokens) this node keeps \
              cached at once, in addition to the blocks in the pagepool. Raise it on \
              nodes that touch many files (login, gateway, protocol nodes, metanodes of \
              widely shared files); the seeds use 128K on such nodes. Each entry costs \
              memory on this node and token state on the token servers, so check both \
              before raising it. The cache is sized at start.",
    },
    ParamSpec {
        id: ParamId::MaxStatCache,
        name: "maxStatCache",
        kind: ParamKind::Int {
            min: 0,
            max: 100_000_000,
        },
        default: DefaultValue::Int(131_072),
        scope: Scope::Node,
        apply: Apply::Restart,
        unit: "inodes",
        doc: "How many attribute-only entries (just enough of an inode to answer \
              stat()) this node keeps beyond maxFilesToCache, each under the inode's \
              token, so that the kernel may keep the attributes as long as the entry \
              lives. An entry is much smaller than a maxFilesToCache entry (no content, \
              no extended attributes: well under 1 KiB with its token), so raise this \
              for `ls -l`-heavy nodes rather than maxFilesToCache. The default (128K, as \
              the seeds use) keeps the attributes of 128K files for at most about \
              100 MiB; 0 disables the stat cache. Sized at start.",
    },
    ParamSpec {
        id: ParamId::WorkerThreads,
        name: "workerThreads",
        kind: ParamKind::Int { min: 1, max: 8192 },
        default: DefaultValue::Int(16),
        scope: Scope::Node,
        apply: Apply::Restart,
        unit: "threads",
        doc: "Threads that serve FUSE requests (and so how many application requests \
              can be in progress at once on this node). Too few limits parallel I/O; too \
              many adds lock contention. The seeds start large servers at 512 or 1024; \
              Mako's default of 16 suits a small node (a couple of cores) and should \
              grow with cores and outstanding I/O. Threads start with the daemon.",
    },
    ParamSpec {
        id: ParamId::MaxMBpS,
        name: "maxMBpS",
        kind: ParamKind::Int {
            min: 1,
            max: 10_000_000,
        },
        default: DefaultValue::Int(2048),
        scope: Scope::Node,
        apply: Apply::Immediate,
        unit: "MB/s",
        doc: "The rate at which this node submits background I/O: how deep write-behind \
              and prefetch run ahead of the application. The seeds set it to twice the \
              node's network bandwidth to the file system (2048 suits 1 GiB/s). Too low \
              caps streaming throughput; too high floods servers with speculative I/O.",
    },
    ParamSpec {
        id: ParamId::PrefetchAggressivenessRead,
        name: "prefetchAggressivenessRead",
        kind: ParamKind::Int { min: -1, max: 3 },
        default: DefaultValue::Int(-1),
        scope: Scope::Node,
        apply: Apply::Immediate,
        unit: "level (-1 = automatic)",
        doc: "How eagerly sequential and strided reads trigger read-ahead of whole \
              blocks: -1 lets Mako decide from measured prefetch efficiency, 0 disables \
              read prefetch, 1..3 prefetch progressively further ahead. The seeds set 0 \
              (with -i) for benchmark clients whose applications give their own hints.",
    },
    ParamSpec {
        id: ParamId::PrefetchLargeBlockThreshold,
        name: "prefetchLargeBlockThreshold",
        kind: ParamKind::Bytes {
            min: 0,
            max: BLOCK_SIZE_BYTES_MAX,
            multiple_of: 1,
        },
        default: DefaultValue::Bytes(0),
        scope: Scope::Node,
        apply: Apply::Immediate,
        unit: "bytes (0 = off)",
        doc: "For file systems whose block size is at least this, prefetch ramps up more \
              slowly, so short sequential runs followed by a seek do not pull in whole \
              large blocks that are never read. The seeds enable it by setting it to the \
              block size (e.g. 4M, with -i) and saw excessive prefetch traffic disappear. \
              0 (the default) keeps the normal ramp-up.",
    },
    ParamSpec {
        id: ParamId::PrefetchPartitions,
        name: "prefetchPartitions",
        kind: ParamKind::Int {
            min: 1,
            max: PREFETCH_PARTITIONS_MAX,
        },
        default: DefaultValue::Int(1),
        scope: Scope::Node,
        apply: Apply::Restart,
        unit: "partitions",
        doc: "Splits the prefetch queue and its lock into this many shards. The seeds \
              raise it when many application threads make prefetch threads contend on \
              one mutex; the cost is that each shard gets fewer prefetch threads, which \
              hurts workloads with few readers. Must not exceed prefetchThreads.",
    },
    ParamSpec {
        id: ParamId::PrefetchThreads,
        name: "prefetchThreads",
        kind: ParamKind::Int {
            min: PREFETCH_THREADS_MIN,
            max: PREFETCH_THREADS_MAX,
        },
        default: DefaultValue::Int(PREFETCH_THREADS_DEFAULT),
        scope: Scope::Node,
        apply: Apply::Restart,
        unit: "threads",
        doc: "Threads that perform prefetch and write-behind I/O. More threads keep more \
              block I/Os in flight (useful with many disks or high-latency servers); \
              maxMBpS still paces them. Threads start with the daemon.",
    },
    ParamSpec {
        id: ParamId::AvoidDirFragments,
        name: "avoidDirFragments",
        kind: ParamKind::Bool,
        default: DefaultValue::Bool(false),
        scope: Scope::Cluster,
        apply: Apply::Immediate,
        unit: "yes/no",
        doc: "When a directory grows out of its inode, give it a full directory block at \
              once instead of a fragment of subblocks. The seeds enable it for many \
              nodes creating files in one new shared directory, where repeated fragment \
              growth costs token round trips; it wastes space on small directories. \
              Affects only directories that expand after the change.",
    },
    ParamSpec {
        id: ParamId::DirPreSplitLevels,
        name: "DirPreSplitLevels",
        kind: ParamKind::Int { min: 0, max: 10 },
        default: DefaultValue::Int(0),
        scope: Scope::Cluster,
        apply: Apply::Immediate,
        unit: "hash tree level (0 = off)",
        doc: "When a directory leaves its inode, pre-split it at once to this hash tree \
              level, i.e. 2^level directory blocks (6 = 64 blocks, 16M with 256K blocks), \
              so that thousands of concurrent creates do not serialise on block splits. \
              The seeds took 4096-node creates in a new directory from 60-160 s to about \
              15 s with 6. GPFS packs several levels into bytes of a 64-bit value; Mako \
              accepts one level (the low byte). 0 (the default) does no pre-splitting.",
    },
    ParamSpec {
        id: ParamId::DioSmallSeqWriteBatching,
        name: "dioSmallSeqWriteBatching",
        kind: ParamKind::Bool,
        default: DefaultValue::Bool(false),
        scope: Scope::Node,
        apply: Apply::Immediate,
        unit: "yes/no",
        doc: "Hold small sequential direct/async writes (up to dioSmallSeqWriteThreshold) \
              for a few microseconds so that contiguous ones merge into larger writes. \
              The seeds enable it with -i on database clients; it adds microseconds of \
              latency to isolated small writes, so it is off by default.",
    },
    ParamSpec {
        id: ParamId::DioSmallSeqWriteThreshold,
        name: "dioSmallSeqWriteThreshold",
        kind: ParamKind::Bytes {
            min: DIO_SMALL_SEQ_WRITE_THRESHOLD_BYTES_MIN,
            max: DIO_SMALL_SEQ_WRITE_THRESHOLD_BYTES_MAX,
            multiple_of: 1,
        },
        default: DefaultValue::Bytes(DIO_SMALL_SEQ_WRITE_THRESHOLD_BYTES_DEFAULT),
        scope: Scope::Node,
        apply: Apply::Immediate,
        unit: "bytes",
        doc: "Largest direct write that dioSmallSeqWriteBatching holds back for merging \
              (the seeds: default 64K). Larger writes go straight to disk. At most 128K, \
              the smallest fuseMaxWrite, so a held write is always one FUSE request.",
    },
    ParamSpec {
        id: ParamId::FuseMaxWrite,
        name: "fuseMaxWrite",
        kind: ParamKind::Bytes {
            min: FUSE_MAX_WRITE_BYTES_MIN,
            max: FUSE_MAX_WRITE_BYTES_MAX,
            multiple_of: FUSE_PAGE_BYTES,
        },
        default: DefaultValue::Bytes(FUSE_MAX_WRITE_BYTES_DEFAULT),
        scope: Scope::Node,
        apply: Apply::Restart,
        unit: "bytes (multiple of 4K)",
        doc: "Mako's own: the largest write the kernel sends in one FUSE request (FUSE \
              max_write; max_pages follows from it). Larger requests mean fewer context \
              switches per byte and full-block writes for large blocks; the kernel may \
              clamp it lower. Negotiated when the file system is mounted.",
    },
    ParamSpec {
        id: ParamId::FuseWritebackCache,
        name: "fuseWritebackCache",
        kind: ParamKind::Bool,
        default: DefaultValue::Bool(false),
        scope: Scope::Node,
        apply: Apply::Restart,
        unit: "yes/no",
        doc: "Mako's own: let the kernel gather small writes in its page cache and send \
              them to makod as large writes (FUSE writeback cache). Measured on the \
              ior-hard pattern (47008-byte records from 2 writers into one file) it \
              raises the rate about 1.6 times; the kernel then owns file size and mtime \
              while it holds dirty pages, which multi-node coherence does not handle yet, \
              so it is off by default. makod lifts the FUSE device's strict dirty limit \
              when it is on, or the kernel would write back a page or two at a time.",
    },
    ParamSpec {
        id: ParamId::FuseIoUring,
        name: "fuseIoUring",
        kind: ParamKind::Bool,
        default: DefaultValue::Bool(false),
        scope: Scope::Node,
        apply: Apply::Restart,
        unit: "yes/no",
        doc: "Mako's own: take FUSE requests over io_uring (FUSE_OVER_IO_URING, Linux \
              6.14+ built with CONFIG_FUSE_IO_URING) instead of reading and writing \
              /dev/fuse: one queue per CPU, served on that CPU, one system call per \
              request instead of two. The kernel offers it only while \
              /sys/module/fuse/parameters/enable_uring is Y (set by root); otherwise, or \
              if the kernel refuses the queues, makod uses /dev/fuse and logs why \
              (the log line `FUSE transport: ...`). Off by default: it passes the POSIX \
              suite, but the two-mount fsx test died once of SIGBUS over it (not yet \
              understood). Do not set enable_uring to N while a mount uses io_uring: \
              its requests in flight would hang until unmount.",
    },
    ParamSpec {
        id: ParamId::FuseDirectIoFileSize,
        name: "fuseDirectIoFileSize",
        kind: ParamKind::Bytes {
            min: 0,
            max: FUSE_DIRECT_IO_FILE_SIZE_MAX,
            multiple_of: 1,
        },
        default: DefaultValue::Bytes(FUSE_DIRECT_IO_FILE_SIZE_DEFAULT),
        scope: Scope::Node,
        apply: Apply::Immediate,
        unit: "bytes (0 = every file, 1024T = none by size)",
        doc: "Mako's own: files at least this large when opened, and every file opened \
              write-only, bypass the kernel page cache (FUSE direct I/O): data is copied \
              once, between the application's buffer and the pagepool, as GPFS serves \
              reads and writes from its pagepool. On this project's test VM two 1 MiB \
              readers of 2 GiB files streamed 1.34-1.60 GB/s this way, using 1.4-2.1 \
              CPU-seconds per 4 GiB, against 0.68-1.04 GB/s and 4.6-9 CPU-seconds through \
              the page cache (4 alternating pairs). The price: every read call is a request to makod, so a \
              reader of 4 KiB records gets ~230 MB/s instead of ~1.4 GB/s (64 KiB \
              records: 2.0 against 2.7 GB/s). Smaller files, and all files while \
              fuseWritebackCache is on, use the page cache; O_DIRECT opens always bypass \
              it. Applies to opens after the change; mmap works either way.",
    },
    ParamSpec {
        id: ParamId::FailureDetectionTime,
        name: "failureDetectionTime",
        kind: ParamKind::Millis {
            min: FAILURE_DETECTION_TIME_MS_MIN,
            max: 300 * SEC_MS,
            bare: TimeUnit::Seconds,
        },
        default: DefaultValue::Millis(FAILURE_DETECTION_TIME_MS_DEFAULT),
        scope: Scope::Cluster,
        apply: Apply::Restart,
        unit: "duration (bare number = seconds)",
        doc: "Lease duration: how long a node may go without renewing its lease before \
              the cluster manager may expel it and recover its log. The seeds raise it \
              from 35 to 60 seconds where an unhealthy network causes expels, at the \
              price of slower recovery from real failures. Needs a restart on all nodes.",
    },
    ParamSpec {
        id: ParamId::MinMissedPingTimeout,
        name: "minMissedPingTimeout",
        kind: ParamKind::Millis {
            min: SEC_MS,
            max: MIN_MISSED_PING_TIMEOUT_MS_MAX,
            bare: TimeUnit::Seconds,
        },
        default: DefaultValue::Millis(MIN_MISSED_PING_TIMEOUT_MS_DEFAULT),
        scope: Scope::Cluster,
        apply: Apply::Restart,
        unit: "duration (bare number = seconds)",
        doc: "Least time the cluster manager keeps pinging a node whose lease has \
              expired before expelling it. The seeds raise it to 60 together with \
              failureDetectionTime on flaky networks. Must not exceed \
              failureDetectionTime. Needs a restart on all nodes.",
    },
    ParamSpec {
        id: ParamId::MaxTcpConnsPerNodeConn,
        name: "maxTcpConnsPerNodeConn",
        kind: ParamKind::Int { min: 1, max: 16 },
        default: DefaultValue::Int(MAX_TCP_CONNS_PER_NODE_CONN_DEFAULT),
        scope: Scope::Cluster,
        apply: Apply::Restart,
        unit: "connections",
        doc: "TCP connections between each pair of nodes. More connections spread \
              streaming data over more sockets and, with tscSmallMsgTcpConnPct, let some \
              be reserved for small messages. The count is negotiated when the first \
              connection between two nodes is made.",
    },
    ParamSpec {
        id: ParamId::TscSmallMsgSizeThreshold,
        name: "tscSmallMsgSizeThreshold",
        kind: ParamKind::Bytes {
            min: 4 * KIB,
            max: BLOCK_SIZE_BYTES_MAX,
            multiple_of: 1,
        },
        default: DefaultValue::Bytes(TSC_SMALL_MSG_SIZE_THRESHOLD_BYTES_DEFAULT),
        scope: Scope::Node,
        apply: Apply::Immediate,
        unit: "bytes",
        doc: "Messages up to this size are small and use the connections reserved by \
              tscSmallMsgTcpConnPct; larger ones are large. The seeds' default is 512K, \
              which covers 256K directory blocks. The classification is made per message \
              when it is sent.",
    },
    ParamSpec {
        id: ParamId::TscSmallMsgTcpConnPct,
        name: "tscSmallMsgTcpConnPct",
        kind: ParamKind::Int { min: 0, max: 50 },
        default: DefaultValue::Int(TSC_SMALL_MSG_TCP_CONN_PCT_DEFAULT),
        scope: Scope::Cluster,
        apply: Apply::Restart,
        unit: "percent of maxTcpConnsPerNodeConn (rounded down)",
        doc: "Share of the connections between two nodes reserved for small messages, \
              so that a directory listing never queues behind streaming data blocks (the \
              seeds cut an `ls -l` under load from 65 s to 12 s). GPFS defaults to 0; \
              Mako defaults to 50 so that, with 2 connections, one is reserved as DESIGN \
              section 6 requires. Fixed when two nodes first connect.",
    },
    ParamSpec {
        id: ParamId::AllToAllConnection,
        name: "allToAllConnection",
        kind: ParamKind::Enum(ALL_TO_ALL_CONNECTION_CHOICES),
        default: DefaultValue::Text("no"),
        scope: Scope::Cluster,
        apply: Apply::Restart,
        unit: "no | local | remote | all",
        doc: "At cluster join, connect at once to every daemon of the local cluster \
              (local), of remote clusters being joined (remote), or both (all), instead \
              of connecting on first use. The seeds' 4096-node create in a new shared \
              directory went from about 15 s to 8-9 s with remote. Costs sockets and \
              join time on large clusters. Read at join.",
    },
    ParamSpec {
        id: ParamId::IdleSocketTimeout,
        name: "idleSocketTimeout",
        kind: ParamKind::Millis {
            min: 0,
            max: 86_400 * SEC_MS,
            bare: TimeUnit::Seconds,
        },
        default: DefaultValue::Millis(0),
        scope: Scope::Node,
        apply: Apply::Immediate,
        unit: "duration (bare number = seconds; 0 = never)",
        doc: "Close a connection to another node after it has been idle this long. 0 \
              (the default) keeps idle connections open: the seeds set 0 with -i to \
              avoid reconnects, a common source of expels when ARP or TCP setup is slow.",
    },
    ParamSpec {
        id: ParamId::TscTcpPort,
        name: "tscTcpPort",
        kind: ParamKind::Int {
            min: 1,
            max: 65_535,
        },
        default: DefaultValue::Int(TSC_TCP_PORT_DEFAULT),
        scope: Scope::Node,
        apply: Apply::Restart,
        unit: "TCP port",
        doc: "Port on which the daemon accepts connections from the other nodes of the \
              cluster (the RPC layer). GPFS uses 1191 (tscTcpPort), and so does Mako by \
              default; open it between all nodes in the firewall. Give each daemon its \
              own port when several run on one host. Read when the daemon starts.",
    },
    ParamSpec {
        id: ParamId::PrometheusPort,
        name: "prometheusPort",
        kind: ParamKind::Int {
            min: 0,
            max: 65_535,
        },
        default: DefaultValue::Int(9370),
        scope: Scope::Node,
        apply: Apply::Restart,
        unit: "TCP port (0 = off)",
        doc: "Port of the Prometheus metrics endpoint; 0 turns the endpoint off. Give \
              each daemon its own port when several run on one test host.",
    },
    ParamSpec {
        id: ParamId::PrometheusAddress,
        name: "prometheusAddress",
        kind: ParamKind::IpAddr,
        default: DefaultValue::Text("127.0.0.1"),
        scope: Scope::Node,
        apply: Apply::Restart,
        unit: "IP address",
        doc: "Address the Prometheus endpoint listens on. The default, loopback, keeps \
              metrics private to the node; use 0.0.0.0 (or a management network address) \
              to let a central Prometheus scrape it.",
    },
    ParamSpec {
        id: ParamId::IohistSize,
        name: "iohistSize",
        kind: ParamKind::Int {
            min: 0,
            max: 1_048_576,
        },
        default: DefaultValue::Int(512),
        scope: Scope::Node,
        apply: Apply::Immediate,
        unit: "entries (0 = off)",
        doc: "Number of recent I/Os kept for `mako diag iohist` (start, R/W, buffer \
              type, disk:sector, sectors, ms, queue ms, RPC ms, node, thread); GPFS keeps \
              512. Raise it to look further back when diagnosing slow disks; each entry \
              costs about a hundred bytes. 0 stops recording.",
    },
    ParamSpec {
        id: ParamId::WaiterThresholdMillis,
        name: "waiterThresholdMillis",
        kind: ParamKind::Millis {
            min: 0,
            max: 3_600 * SEC_MS,
            bare: TimeUnit::Millis,
        },
        default: DefaultValue::Millis(SEC_MS),
        scope: Scope::Node,
        apply: Apply::Immediate,
        unit: "duration (bare number = milliseconds)",
        doc: "A thread blocked longer than this is a long waiter: listed by default in \
              `mako diag waiters`, counted in the Prometheus long-waiter gauge, and read \
              by the advisor. `mako diag waiters --all` still shows every blocked thread.",
    },
];

/// Every configuration parameter, in [`ParamId`] order.
pub static PARAMS: &[ParamSpec] = PARAM_TABLE;

const fn str_eq_ignore_ascii_case(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if !a[i].eq_ignore_ascii_case(&b[i]) {
            return false;
        }
        i += 1;
    }
    true
}

const fn contains(choices: &[&str], word: &str) -> bool {
    let mut i = 0;
    while i < choices.len() {
        if str_eq_ignore_ascii_case(choices[i], word) {
            return true;
        }
        i += 1;
    }
    false
}

/// Compile-time checks of the registry: order, unique names, sane ranges, fixed
/// defaults inside their ranges. Computed defaults are checked by tests.
const fn check_registry(params: &[ParamSpec]) {
    assert!(
        params.len() == PARAM_COUNT,
        "PARAMS must list every ParamId"
    );
    let mut i = 0;
    while i < params.len() {
        let p = &params[i];
        assert!(p.id as usize == i, "PARAMS must be listed in ParamId order");
        assert!(!p.name.is_empty(), "parameter names must not be empty");
        assert!(!p.doc.is_empty(), "every parameter needs a doc");
        let mut j = 0;
        while j < i {
            assert!(
                !str_eq_ignore_ascii_case(params[j].name, p.name),
                "parameter names must differ in more than case"
            );
            j += 1;
        }
        match (&p.kind, &p.default) {
            (
                ParamKind::Bytes {
                    min,
                    max,
                    multiple_of,
                },
                DefaultValue::Bytes(d),
            ) => {
                assert!(*multiple_of > 0);
                assert!(*min <= *max);
                assert!(*min % *multiple_of == 0);
                assert!(*min <= *d);
                assert!(*d <= *max);
                assert!(*d % *multiple_of == 0);
            }
            (
                ParamKind::Bytes {
                    min,
                    max,
                    multiple_of,
                },
                DefaultValue::Computed { .. },
            ) => {
                assert!(*multiple_of > 0);
                assert!(*min <= *max);
            }
            (ParamKind::Int { min, max }, DefaultValue::Int(d)) => {
                assert!(*min <= *max);
                assert!(*min <= *d);
                assert!(*d <= *max);
            }
            (ParamKind::Bool, DefaultValue::Bool(_)) => {}
            (ParamKind::Enum(choices), DefaultValue::Text(d)) => {
                assert!(!choices.is_empty());
                assert!(
                    contains(choices, d),
                    "enum default must be one of its choices"
                );
            }
            (ParamKind::Millis { min, max, .. }, DefaultValue::Millis(d)) => {
                assert!(*min <= *max);
                assert!(*min <= *d);
                assert!(*d <= *max);
            }
            // The address is checked by the default-parses test; const fn cannot parse it.
            (ParamKind::IpAddr, DefaultValue::Text(_)) => {}
            _ => panic!("a parameter's default does not match its kind"),
        }
        i += 1;
    }
}

const _: () = check_registry(PARAM_TABLE);

/// Finds a parameter by its exact (case-sensitive) name.
pub fn find(name: &str) -> Option<&'static ParamSpec> {
    PARAMS.iter().find(|p| p.name == name)
}

/// Finds a parameter by its exact name, or explains that there is none and suggests the
/// closest one.
pub fn lookup(name: &str) -> Result<&'static ParamSpec> {
    find(name).ok_or_else(|| ConfigError::UnknownParameter {
        name: name.to_string(),
        suggestion: suggest(name),
    })
}

/// The registered name closest to `name`: one that differs only in case, else one within
/// a small edit distance, else the only name that starts with `name`.
pub fn suggest(name: &str) -> Option<&'static str> {
    let wanted = name.trim().to_ascii_lowercase();
    if wanted.is_empty() {
        return None;
    }
    if let Some(p) = PARAMS.iter().find(|p| p.name.eq_ignore_ascii_case(&wanted)) {
        return Some(p.name);
    }
    // Allow about one typo per three letters, but never more than three edits, so that
    // short unrelated words do not match.
    let allowed = (wanted.chars().count() / 3).clamp(1, 3);
    let closest = PARAMS
        .iter()
        .map(|p| (edit_distance(&wanted, &p.name.to_ascii_lowercase()), p.name))
        .min_by_key(|&(distance, _)| distance);
    if let Some((distance, name)) = closest {
        if distance <= allowed {
            return Some(name);
        }
    }
    let mut prefixed = PARAMS
        .iter()
        .filter(|p| wanted.len() >= 4 && p.name.to_ascii_lowercase().starts_with(&wanted));
    match (prefixed.next(), prefixed.next()) {
        (Some(only), None) => Some(only.name),
        _ => None,
    }
}

/// Levenshtein distance between two strings, counted in characters.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        current[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::{parse_for, validate};

    #[test]
    fn every_default_is_valid_and_round_trips() {
        for spec in PARAMS {
            let value = spec.default.value();
            validate(spec, &value, &value.to_string())
                .unwrap_or_else(|e| panic!("default of {} is invalid: {e}", spec.name));
            let reparsed = parse_for(spec, &value.to_string())
                .unwrap_or_else(|e| panic!("default of {} does not parse: {e}", spec.name));
            assert_eq!(reparsed, value, "{}", spec.name);
        }
    }

    #[test]
    fn ids_match_positions_and_names_resolve() {
        for (index, spec) in PARAMS.iter().enumerate() {
            assert_eq!(spec.id as usize, index);
            assert_eq!(spec.id.name(), spec.name);
            assert!(std::ptr::eq(lookup(spec.name).unwrap(), spec));
        }
    }

    #[test]
    fn pagepool_default_follows_the_rule() {
        let Value::Bytes(bytes) = pagepool_default() else {
            panic!("pagepool is a size")
        };
        assert!(bytes >= PAGEPOOL_BYTES_MIN);
        assert!(bytes <= PAGEPOOL_DEFAULT_BYTES_CAP);
        assert_eq!(bytes % MIB, 0);
        if let Some(ram) = physical_memory_bytes() {
            let quarter = ram / 100 * PAGEPOOL_DEFAULT_RAM_PERCENT;
            assert!(bytes <= quarter.max(PAGEPOOL_BYTES_MIN));
        }
    }

    #[test]
    fn suggestions() {
        assert_eq!(suggest("PagePool"), Some("pagepool"));
        assert_eq!(suggest("maxfilestocache"), Some("maxFilesToCache"));
        assert_eq!(suggest("pagepol"), Some("pagepool"));
        assert_eq!(suggest("maxFileToCache"), Some("maxFilesToCache"));
        assert_eq!(suggest("workerThread"), Some("workerThreads"));
        assert_eq!(suggest("dirPreSplitLevels"), Some("DirPreSplitLevels"));
        assert_eq!(
            suggest("prefetchAggressiveness"),
            Some("prefetchAggressivenessRead")
        );
        assert_eq!(suggest("xyz"), None);
        assert_eq!(suggest(""), None);
        assert_eq!(suggest("completelyUnrelatedName"), None);
    }

    #[test]
    fn unknown_name_error_says_did_you_mean() {
        let message = lookup("pagePool").unwrap_err().to_string();
        assert!(message.contains("`pagePool`"), "{message}");
        assert!(message.contains("did you mean `pagepool`?"), "{message}");
        let message = lookup("nonsense").unwrap_err().to_string();
        assert!(!message.contains("did you mean"), "{message}");
        assert!(message.contains("mako config show"), "{message}");
    }

    #[test]
    fn edit_distance_basics() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("abc", ""), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("pagepool", "pagepool"), 0);
    }
}
