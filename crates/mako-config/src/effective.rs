//! `EffectiveConfig`: the value of every parameter as the daemon uses it, with where the
//! value came from, built from defaults, the config store and command-line overrides,
//! and changed at run time only through `apply_immediate` (`mako config set -i`).
//!
//! It also renders `mako config show` (`show_table`) and `mako config explain`
//! (`explain`). Every value held here has been validated against its parameter's range
//! and the relations between parameters, so the typed getters cannot fail.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::error::{ConfigError, Result};
use crate::relations::{self, reserved_small_message_connections};
use crate::spec::{lookup, Apply, ParamId, ParamSpec, Scope, FUSE_PAGE_BYTES, PARAMS};
use crate::store::ConfigStore;
use crate::value::{parse_for, range_text, Value};

/// Where an effective value came from; later sources override earlier ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// The built-in default (possibly computed from the machine).
    Default,
    /// The cluster's config file (`mako config set`).
    ClusterConfig,
    /// An override given on the daemon's command line.
    CommandLine,
    /// Changed in the running daemon with `mako config set -i`.
    Immediate,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Default => "default",
            Source::ClusterConfig => "cluster config",
            Source::CommandLine => "command line",
            Source::Immediate => "immediate (-i)",
        })
    }
}

/// One resolved parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The value in use.
    pub value: Value,
    /// Where it came from.
    pub source: Source,
}

/// One line of `mako config show`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Parameter name.
    pub name: &'static str,
    /// Current value in the administrator's notation.
    pub value: String,
    /// Where the current value came from.
    pub source: Source,
    /// Default value in the administrator's notation.
    pub default: String,
    /// Allowed range, e.g. `64M..256G`.
    pub range: String,
    /// Whether `-i` can change it.
    pub apply: Apply,
    /// Node or cluster scope.
    pub scope: Scope,
}

/// How `allToAllConnection` connects daemons at cluster join.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllToAllConnection {
    /// Connect on first use only.
    No,
    /// Connect to every daemon of the local cluster.
    Local,
    /// Connect to every daemon of a remote cluster being joined.
    Remote,
    /// Both local and remote.
    All,
}

/// Resolved values of every parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectiveConfig {
    /// Indexed by `ParamId as usize`; always `PARAMS.len()` long.
    entries: Vec<Entry>,
}

impl Default for EffectiveConfig {
    fn default() -> Self {
        Self::defaults()
    }
}

impl EffectiveConfig {
    /// Every parameter at its default (computed defaults are computed now).
    pub fn defaults() -> Self {
        let entries = PARAMS
            .iter()
            .map(|p| Entry {
                value: p.default.value(),
                source: Source::Default,
            })
            .collect();
        EffectiveConfig { entries }
    }

    /// Defaults, overridden by the store, overridden by `NAME=VALUE`-style
    /// `(name, value)` command-line overrides; then the relations are checked.
    pub fn resolve(store: Option<&ConfigStore>, overrides: &[(&str, &str)]) -> Result<Self> {
        let mut config = Self::defaults();
        if let Some(store) = store {
            for (spec, value) in store.iter() {
                config.entries[spec.id as usize] = Entry {
                    value: value.clone(),
                    source: Source::ClusterConfig,
                };
            }
        }
        for (name, text) in overrides {
            let spec = lookup(name)?;
            let value = parse_for(spec, text)?;
            config.entries[spec.id as usize] = Entry {
                value,
                source: Source::CommandLine,
            };
        }
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<()> {
        let values: Vec<Value> = self.entries.iter().map(|e| e.value.clone()).collect();
        relations::check(&values)
    }

    /// Changes parameter `name` in the running daemon (`mako config set -i`) and returns
    /// the previous value. Refuses restart-only parameters, invalid values, and values
    /// that break a relation with another parameter; on refusal nothing changes.
    pub fn apply_immediate(&mut self, name: &str, text: &str) -> Result<Value> {
        let spec = lookup(name)?;
        if spec.apply == Apply::Restart {
            return Err(ConfigError::RestartRequired { name: spec.name });
        }
        let value = parse_for(spec, text)?;
        let index = spec.id as usize;
        let previous = std::mem::replace(
            &mut self.entries[index],
            Entry {
                value,
                source: Source::Immediate,
            },
        );
        if let Err(error) = self.check() {
            self.entries[index] = previous;
            return Err(error);
        }
        Ok(previous.value)
    }

    /// The resolved entry of parameter `name`.
    pub fn entry(&self, name: &str) -> Result<&Entry> {
        Ok(&self.entries[lookup(name)?.id as usize])
    }

    /// The value of a parameter.
    pub fn get(&self, id: ParamId) -> &Value {
        &self.entries[id as usize].value
    }

    /// Where a parameter's value came from.
    pub fn source(&self, id: ParamId) -> Source {
        self.entries[id as usize].source
    }

    /// Every parameter for `mako config show`, in registry order.
    pub fn show_table(&self) -> Vec<Row> {
        PARAMS
            .iter()
            .zip(&self.entries)
            .map(|(spec, entry)| Row {
                name: spec.name,
                value: entry.value.to_string(),
                source: entry.source,
                default: spec.default.value().to_string(),
                range: range_text(&spec.kind),
                apply: spec.apply,
                scope: spec.scope,
            })
            .collect()
    }

    /// Multi-line description of parameter `name` for `mako config explain NAME`.
    pub fn explain(&self, name: &str) -> Result<String> {
        let spec = lookup(name)?;
        Ok(self.explain_spec(spec))
    }

    fn explain_spec(&self, spec: &ParamSpec) -> String {
        let entry = &self.entries[spec.id as usize];
        let default = match spec.default.rule() {
            Some(rule) => format!("{} on this node ({rule})", spec.default.value()),
            None => spec.default.value().to_string(),
        };
        let mut text = format!(
            "{name}\n  value:    {value} (from {source})\n  default:  {default}\n  \
             range:    {range}\n  unit:     {unit}\n  changes:  {apply}\n  scope:    {scope}\n\n",
            name = spec.name,
            value = entry.value,
            source = entry.source,
            range = range_text(&spec.kind),
            unit = spec.unit,
            apply = spec.apply.describe(),
            scope = spec.scope.describe(),
        );
        for line in wrap(spec.doc, 76) {
            text.push_str("  ");
            text.push_str(&line);
            text.push('\n');
        }
        text
    }

    fn bytes(&self, id: ParamId) -> u64 {
        match self.get(id) {
            Value::Bytes(v) => *v,
            other => unreachable!("{} holds {other:?}, not a size", id.name()),
        }
    }

    fn int(&self, id: ParamId) -> i64 {
        match self.get(id) {
            Value::Int(v) => *v,
            other => unreachable!("{} holds {other:?}, not a whole number", id.name()),
        }
    }

    /// A whole number whose range makes it a valid count.
    fn count(&self, id: ParamId) -> usize {
        usize::try_from(self.int(id))
            .unwrap_or_else(|_| unreachable!("{} is range-checked non-negative", id.name()))
    }

    fn flag(&self, id: ParamId) -> bool {
        match self.get(id) {
            Value::Bool(v) => *v,
            other => unreachable!("{} holds {other:?}, not a boolean", id.name()),
        }
    }

    fn text(&self, id: ParamId) -> &str {
        match self.get(id) {
            Value::Text(v) => v,
            other => unreachable!("{} holds {other:?}, not text", id.name()),
        }
    }

    fn duration(&self, id: ParamId) -> Duration {
        match self.get(id) {
            Value::Millis(v) => Duration::from_millis(*v),
            other => unreachable!("{} holds {other:?}, not a duration", id.name()),
        }
    }

    /// `pagepool`: bytes of the data and metadata cache.
    pub fn pagepool_bytes(&self) -> u64 {
        self.bytes(ParamId::Pagepool)
    }

    /// `maxFilesToCache`: files (full inodes) kept cached.
    pub fn max_files_to_cache(&self) -> usize {
        self.count(ParamId::MaxFilesToCache)
    }

    /// `maxStatCache`: attribute-only entries kept cached (0 = none).
    pub fn max_stat_cache(&self) -> usize {
        self.count(ParamId::MaxStatCache)
    }

    /// `workerThreads`: FUSE request threads.
    pub fn worker_threads(&self) -> usize {
        self.count(ParamId::WorkerThreads)
    }

    /// `maxMBpS`: background I/O pacing in MB/s.
    pub fn max_mbps(&self) -> u64 {
        self.int(ParamId::MaxMBpS).unsigned_abs()
    }

    /// `prefetchAggressivenessRead`: `None` = automatic (-1), else level 0..=3
    /// (0 = read prefetch off).
    pub fn prefetch_aggressiveness_read(&self) -> Option<u8> {
        u8::try_from(self.int(ParamId::PrefetchAggressivenessRead)).ok()
    }

    /// `prefetchLargeBlockThreshold`: block size from which prefetch ramps up slowly;
    /// 0 = never.
    pub fn prefetch_large_block_threshold_bytes(&self) -> u64 {
        self.bytes(ParamId::PrefetchLargeBlockThreshold)
    }

    /// `prefetchPartitions`: shards of the prefetch queue (at most `prefetch_threads`).
    pub fn prefetch_partitions(&self) -> usize {
        self.count(ParamId::PrefetchPartitions)
    }

    /// `prefetchThreads`: prefetch and write-behind I/O threads.
    pub fn prefetch_threads(&self) -> usize {
        self.count(ParamId::PrefetchThreads)
    }

    /// `avoidDirFragments`: give directories a full block when they leave the inode.
    pub fn avoid_dir_fragments(&self) -> bool {
        self.flag(ParamId::AvoidDirFragments)
    }

    /// `DirPreSplitLevels`: hash tree level to pre-split new directories to (0 = off;
    /// level n = 2^n directory blocks).
    pub fn dir_pre_split_levels(&self) -> u8 {
        u8::try_from(self.int(ParamId::DirPreSplitLevels))
            .unwrap_or_else(|_| unreachable!("DirPreSplitLevels is range-checked to 0..=10"))
    }

    /// `dioSmallSeqWriteBatching`: merge small sequential direct writes.
    pub fn dio_small_seq_write_batching(&self) -> bool {
        self.flag(ParamId::DioSmallSeqWriteBatching)
    }

    /// `dioSmallSeqWriteThreshold`: largest direct write held for batching.
    pub fn dio_small_seq_write_threshold_bytes(&self) -> u64 {
        self.bytes(ParamId::DioSmallSeqWriteThreshold)
    }

    /// `fuseWritebackCache`: let the kernel gather small writes (FUSE writeback cache).
    pub fn fuse_writeback_cache(&self) -> bool {
        self.flag(ParamId::FuseWritebackCache)
    }

    /// `fuseIoUring`: take FUSE requests over io_uring when the kernel offers it.
    pub fn fuse_io_uring(&self) -> bool {
        self.flag(ParamId::FuseIoUring)
    }

    /// `fuseDirectIoFileSize`: files at least this large open with FUSE direct I/O.
    pub fn fuse_direct_io_file_size(&self) -> u64 {
        self.bytes(ParamId::FuseDirectIoFileSize)
    }

    /// `fuseMaxWrite`: FUSE `max_write` in bytes (a multiple of 4 KiB).
    pub fn fuse_max_write_bytes(&self) -> u32 {
        u32::try_from(self.bytes(ParamId::FuseMaxWrite))
            .unwrap_or_else(|_| unreachable!("fuseMaxWrite is range-checked to at most 16M"))
    }

    /// FUSE `max_pages` that goes with `fuse_max_write_bytes`.
    pub fn fuse_max_pages(&self) -> u32 {
        let page = u32::try_from(FUSE_PAGE_BYTES).unwrap_or(4096);
        self.fuse_max_write_bytes() / page
    }

    /// `failureDetectionTime`: the lease duration.
    pub fn failure_detection_time(&self) -> Duration {
        self.duration(ParamId::FailureDetectionTime)
    }

    /// `minMissedPingTimeout`: least time an expired node is pinged before expulsion.
    pub fn min_missed_ping_timeout(&self) -> Duration {
        self.duration(ParamId::MinMissedPingTimeout)
    }

    /// `maxTcpConnsPerNodeConn`: TCP connections per node pair.
    pub fn max_tcp_conns_per_node_conn(&self) -> usize {
        self.count(ParamId::MaxTcpConnsPerNodeConn)
    }

    /// `tscSmallMsgSizeThreshold`: largest message that counts as small.
    pub fn tsc_small_msg_size_threshold_bytes(&self) -> u64 {
        self.bytes(ParamId::TscSmallMsgSizeThreshold)
    }

    /// `tscSmallMsgTcpConnPct`: percent of connections reserved for small messages.
    pub fn tsc_small_msg_tcp_conn_pct(&self) -> u8 {
        u8::try_from(self.int(ParamId::TscSmallMsgTcpConnPct))
            .unwrap_or_else(|_| unreachable!("tscSmallMsgTcpConnPct is range-checked to 0..=50"))
    }

    /// Connections per node pair reserved for small messages (rounded down).
    pub fn small_msg_tcp_conns(&self) -> usize {
        let reserved = reserved_small_message_connections(
            self.int(ParamId::MaxTcpConnsPerNodeConn),
            self.int(ParamId::TscSmallMsgTcpConnPct),
        );
        usize::try_from(reserved).unwrap_or(0)
    }

    /// `allToAllConnection`: which daemons to connect to at join.
    pub fn all_to_all_connection(&self) -> AllToAllConnection {
        match self.text(ParamId::AllToAllConnection) {
            "local" => AllToAllConnection::Local,
            "remote" => AllToAllConnection::Remote,
            "all" => AllToAllConnection::All,
            _ => AllToAllConnection::No,
        }
    }

    /// `idleSocketTimeout`: `None` = never close idle connections.
    pub fn idle_socket_timeout(&self) -> Option<Duration> {
        Some(self.duration(ParamId::IdleSocketTimeout)).filter(|d| !d.is_zero())
    }

    /// `tscTcpPort`: port the daemon listens on for other nodes.
    pub fn tsc_tcp_port(&self) -> u16 {
        u16::try_from(self.int(ParamId::TscTcpPort))
            .unwrap_or_else(|_| unreachable!("tscTcpPort is range-checked to 1..=65535"))
    }

    /// `prometheusPort`: `None` = endpoint off.
    pub fn prometheus_port(&self) -> Option<u16> {
        u16::try_from(self.int(ParamId::PrometheusPort))
            .ok()
            .filter(|&port| port != 0)
    }

    /// `prometheusAddress`: address the endpoint listens on.
    pub fn prometheus_address(&self) -> IpAddr {
        self.text(ParamId::PrometheusAddress)
            .parse()
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Where the Prometheus endpoint listens; `None` when it is off.
    pub fn prometheus_socket_addr(&self) -> Option<SocketAddr> {
        self.prometheus_port()
            .map(|port| SocketAddr::new(self.prometheus_address(), port))
    }

    /// `iohistSize`: I/O history entries kept (0 = off).
    pub fn iohist_size(&self) -> usize {
        self.count(ParamId::IohistSize)
    }

    /// `waiterThresholdMillis`: a wait longer than this is a long waiter.
    pub fn waiter_threshold(&self) -> Duration {
        self.duration(ParamId::WaiterThresholdMillis)
    }
}

/// Greedy word wrap at `width` columns.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{GIB, KIB, MIB, PAGEPOOL_BYTES_MIN, PAGEPOOL_DEFAULT_BYTES_CAP};

    #[test]
    fn defaults_through_getters() {
        let config = EffectiveConfig::defaults();
        let pagepool = config.pagepool_bytes();
        assert!((PAGEPOOL_BYTES_MIN..=PAGEPOOL_DEFAULT_BYTES_CAP).contains(&pagepool));
        assert_eq!(config.max_files_to_cache(), 4000);
        assert_eq!(config.max_stat_cache(), 131_072);
        assert_eq!(config.worker_threads(), 16);
        assert_eq!(config.max_mbps(), 2048);
        assert_eq!(config.prefetch_aggressiveness_read(), None);
        assert_eq!(config.prefetch_large_block_threshold_bytes(), 0);
        assert_eq!(config.prefetch_partitions(), 1);
        assert_eq!(config.prefetch_threads(), 32);
        assert!(!config.avoid_dir_fragments());
        assert_eq!(config.dir_pre_split_levels(), 0);
        assert!(!config.dio_small_seq_write_batching());
        assert_eq!(config.dio_small_seq_write_threshold_bytes(), 64 * KIB);
        assert_eq!(config.fuse_max_write_bytes(), 4 << 20);
        assert_eq!(config.fuse_max_pages(), 1024);
        assert_eq!(config.failure_detection_time(), Duration::from_secs(35));
        assert_eq!(config.min_missed_ping_timeout(), Duration::from_secs(3));
        assert_eq!(config.max_tcp_conns_per_node_conn(), 2);
        assert_eq!(config.tsc_small_msg_size_threshold_bytes(), 512 * KIB);
        assert_eq!(config.tsc_small_msg_tcp_conn_pct(), 50);
        assert_eq!(config.small_msg_tcp_conns(), 1);
        assert_eq!(config.all_to_all_connection(), AllToAllConnection::No);
        assert_eq!(config.idle_socket_timeout(), None);
        assert_eq!(config.tsc_tcp_port(), 1191);
        assert_eq!(config.prometheus_port(), Some(9370));
        assert_eq!(
            config.prometheus_socket_addr(),
            Some("127.0.0.1:9370".parse().unwrap())
        );
        assert_eq!(config.iohist_size(), 512);
        assert_eq!(config.waiter_threshold(), Duration::from_secs(1));
        assert!(config
            .show_table()
            .iter()
            .all(|row| row.source == Source::Default));
    }

    #[test]
    fn sources_layer_in_order() {
        let mut store = ConfigStore::new("unused.toml");
        store.set("pagepool", "2G").unwrap();
        store.set("maxFilesToCache", "128K").unwrap();
        store.set("prometheusPort", "0").unwrap();
        let config = EffectiveConfig::resolve(
            Some(&store),
            &[
                ("maxFilesToCache", "50000"),
                ("prefetchAggressivenessRead", "0"),
            ],
        )
        .unwrap();
        assert_eq!(config.pagepool_bytes(), 2 * GIB);
        assert_eq!(config.source(ParamId::Pagepool), Source::ClusterConfig);
        assert_eq!(config.max_files_to_cache(), 50_000);
        assert_eq!(config.source(ParamId::MaxFilesToCache), Source::CommandLine);
        assert_eq!(config.prefetch_aggressiveness_read(), Some(0));
        assert_eq!(config.prometheus_port(), None);
        assert_eq!(config.prometheus_socket_addr(), None);
        assert_eq!(config.source(ParamId::WorkerThreads), Source::Default);
        let entry = config.entry("maxFilesToCache").unwrap();
        assert_eq!(entry.value, Value::Int(50_000));
    }

    #[test]
    fn resolve_refuses_bad_overrides_and_broken_relations() {
        let message = EffectiveConfig::resolve(None, &[("pagepol", "4G")])
            .unwrap_err()
            .to_string();
        assert!(message.contains("did you mean `pagepool`?"), "{message}");
        let message = EffectiveConfig::resolve(None, &[("pagepool", "4Q")])
            .unwrap_err()
            .to_string();
        assert!(message.contains("pagepool: cannot read `4Q`"), "{message}");
        let message = EffectiveConfig::resolve(None, &[("prefetchPartitions", "33")])
            .unwrap_err()
            .to_string();
        assert!(message.contains("prefetchThreads (32)"), "{message}");
    }

    #[test]
    fn apply_immediate_changes_immediate_parameters() {
        let mut config = EffectiveConfig::defaults();
        let previous = config.apply_immediate("maxMBpS", "8000").unwrap();
        assert_eq!(previous, Value::Int(2048));
        assert_eq!(config.max_mbps(), 8000);
        assert_eq!(config.source(ParamId::MaxMBpS), Source::Immediate);
        config
            .apply_immediate("prefetchLargeBlockThreshold", "4M")
            .unwrap();
        assert_eq!(config.prefetch_large_block_threshold_bytes(), 4 * MIB);
        config.apply_immediate("idleSocketTimeout", "0").unwrap();
        config
            .apply_immediate("dioSmallSeqWriteBatching", "yes")
            .unwrap();
        assert!(config.dio_small_seq_write_batching());
        config.apply_immediate("DirPreSplitLevels", "6").unwrap();
        assert_eq!(config.dir_pre_split_levels(), 6);
    }

    #[test]
    fn apply_immediate_refuses_restart_parameters() {
        let mut config = EffectiveConfig::defaults();
        let before = config.clone();
        let message = config
            .apply_immediate("pagepool", "8G")
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "pagepool cannot change while the daemon runs; it takes effect at the next \
             `mako down`/`mako up` (set it without -i to store it for the next start)"
        );
        for spec in PARAMS.iter().filter(|p| p.apply == Apply::Restart) {
            let default = spec.default.value().to_string();
            let error = config.apply_immediate(spec.name, &default).unwrap_err();
            assert!(
                matches!(error, ConfigError::RestartRequired { .. }),
                "{}",
                spec.name
            );
        }
        assert_eq!(config, before);
    }

    #[test]
    fn apply_immediate_refuses_bad_values_without_changing_anything() {
        let mut config = EffectiveConfig::defaults();
        let before = config.clone();
        assert!(config.apply_immediate("maxMBpS", "0").is_err());
        assert!(config.apply_immediate("maxMBps", "10").is_err());
        assert!(config.apply_immediate("iohistSize", "lots").is_err());
        assert_eq!(config, before);
    }

    #[test]
    fn explain_says_everything() {
        let mut config = EffectiveConfig::defaults();
        config.apply_immediate("maxMBpS", "4096").unwrap();
        let text = config.explain("maxMBpS").unwrap();
        assert!(text.starts_with("maxMBpS\n"), "{text}");
        assert!(
            text.contains("value:    4096 (from immediate (-i))"),
            "{text}"
        );
        assert!(text.contains("default:  2048"), "{text}");
        assert!(
            text.contains("range:    1..10000000\n  unit:     MB/s\n"),
            "{text}"
        );
        assert!(text.contains("immediately with -i"), "{text}");
        assert!(text.contains("twice the"), "{text}");
        let text = config.explain("pagepool").unwrap();
        assert!(text.contains("25% of physical memory"), "{text}");
        assert!(text.contains("mako down"), "{text}");
        assert!(text.lines().all(|line| line.len() <= 80), "{text}");
        assert!(config.explain("pagePool").is_err());
        for spec in PARAMS {
            assert!(config.explain(spec.name).unwrap().contains(spec.name));
        }
    }

    #[test]
    fn show_table_lists_every_parameter() {
        let mut store = ConfigStore::new("unused.toml");
        store.set("pagepool", "1G").unwrap();
        let config = EffectiveConfig::resolve(Some(&store), &[]).unwrap();
        let rows = config.show_table();
        assert_eq!(rows.len(), PARAMS.len());
        let pagepool = rows.iter().find(|r| r.name == "pagepool").unwrap();
        assert_eq!(pagepool.value, "1G");
        assert_eq!(pagepool.source, Source::ClusterConfig);
        assert_eq!(pagepool.range, "64M..256G");
        assert_eq!(pagepool.apply, Apply::Restart);
        let fuse = rows.iter().find(|r| r.name == "fuseMaxWrite").unwrap();
        assert_eq!(fuse.default, "4M");
        assert_eq!(fuse.range, "128K..16M, a multiple of 4K");
    }
}
