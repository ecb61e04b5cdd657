//! The Prometheus endpoint: `GET /metrics` in the OpenMetrics text format (1.0.0,
//! which Prometheus reads), with the figures of `mako diag stats`, `mako diag counters`
//! and `mako diag waiters`, and the space and pagepool gauges of `mako status`.
//!
//! The exposition is encoded by `prometheus-client` from a snapshot of the daemon's
//! figures taken at each scrape (a `Collector`): makod's counters live where they are
//! counted, so nothing is registered ahead of time. The request head is parsed by
//! `httparse`. The server around it stays small and ours: one thread, one request per
//! connection (`Connection: close`), the head bounded in bytes and in time, so a slow or
//! hostile client cannot hold memory or the thread for long — tiny_http, the small
//! synchronous server crate, reads a header line without limit and has no read timeout,
//! which would let one client grow makod's memory. Scrapes are rare (seconds apart) and
//! cheap, which is why one thread is enough. It listens on loopback unless
//! `prometheusAddress` says otherwise.

use crate::daemon::{Daemon, FsCounters};
use mako_control::DaemonStatus;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest request head read; a scrape's head is a few hundred bytes.
const REQUEST_HEAD_BYTES_MAX: usize = 8 << 10;
/// How long a client may take to send its request or receive the answer.
const CLIENT_TIMEOUT_MS: u64 = 2_000;
/// How often the accept loop looks at the stop flag.
const STOP_POLL_MS: u64 = 50;

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` and serves until `stop` is set. A bind failure is logged with what to
/// do about it and returns `None`: metrics are never a reason to refuse to start.
pub fn start(
    addr: SocketAddr,
    daemon: Arc<Daemon>,
    stop: Arc<AtomicBool>,
) -> Option<JoinHandle<()>> {
    let listener = match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
                format!(
                    "port {} is in use (another makod on this host?): give this daemon its own port with \
                     `mako config set prometheusPort=<port>` (0 turns the endpoint off) and restart it",
                    addr.port()
                )
            } else {
                "check prometheusAddress (`mako config show`) and set it to an address of this node"
                    .to_string()
            };
            tracing::error!("Prometheus endpoint: cannot listen on {addr}: {e}; {hint}. makod runs on without it");
            return None;
        }
    };
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!("Prometheus endpoint on {addr}: {e}; makod runs on without it");
        return None;
    }
    tracing::info!("Prometheus endpoint on http://{addr}/metrics");
    let spawned = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if let Err(e) = serve_one(stream, &daemon) {
                            tracing::debug!("metrics request: {e}");
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(STOP_POLL_MS))
                    }
                    Err(e) => {
                        tracing::warn!("metrics endpoint accept: {e}");
                        std::thread::sleep(Duration::from_millis(STOP_POLL_MS));
                    }
                }
            }
        });
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::error!(
                "Prometheus endpoint: cannot start its thread: {e}; makod runs on without it"
            );
            None
        }
    }
}

/// Largest number of header lines a request may have (a scrape sends a handful).
const REQUEST_HEADERS_MAX: usize = 32;

/// Reads one request head (bounded in size and time) and answers it. The head is
/// parsed by httparse.
fn serve_one(mut stream: TcpStream, daemon: &Daemon) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(CLIENT_TIMEOUT_MS)))?;
    stream.set_write_timeout(Some(Duration::from_millis(CLIENT_TIMEOUT_MS)))?;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    // The whole head within the client timeout, not each read: a client that sends a
    // byte at a time must not hold the thread for long.
    let deadline = std::time::Instant::now() + Duration::from_millis(CLIENT_TIMEOUT_MS);
    let (method, path) = loop {
        if std::time::Instant::now() >= deadline {
            return refuse(&mut stream, 408, "request timeout\n");
        }
        let n = stream.read(&mut chunk)?;
        head.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; REQUEST_HEADERS_MAX];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&head) {
            Ok(httparse::Status::Complete(_)) => {
                let method = request.method.unwrap_or("").to_string();
                let target = request.path.unwrap_or("");
                let path = target.split('?').next().unwrap_or("").to_string();
                break (method, path);
            }
            Ok(httparse::Status::Partial) if n > 0 && head.len() < REQUEST_HEAD_BYTES_MAX => {}
            Ok(httparse::Status::Partial) if n == 0 => {
                return refuse(&mut stream, 400, "incomplete request\n");
            }
            Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
                return refuse(&mut stream, 431, "request head too large\n");
            }
            Err(e) => return refuse(&mut stream, 400, &format!("bad request: {e}\n")),
        }
    };
    let head_only = method == "HEAD";
    match (method.as_str(), path.as_str()) {
        ("GET" | "HEAD", "/metrics") => {
            respond(&mut stream, 200, CONTENT_TYPE, &render(daemon), head_only)
        }
        ("GET" | "HEAD", "/") => respond(
            &mut stream,
            200,
            TEXT,
            "Mako metrics: GET /metrics\n",
            head_only,
        ),
        ("GET" | "HEAD", _) => respond(
            &mut stream,
            404,
            TEXT,
            "not found: the metrics are at /metrics\n",
            head_only,
        ),
        _ => respond(
            &mut stream,
            405,
            TEXT,
            "only GET and HEAD are served\n",
            false,
        ),
    }
}

/// Largest number of bytes of a refused request read and dropped after the answer.
const REFUSED_DRAIN_BYTES_MAX: usize = 1 << 20;

/// Answers a request that is not read to its end, then stops sending and reads what the
/// client still sends (at most 1 MiB, for at most the client timeout) before closing: closing with unread
/// data would reset the connection, and the client could lose the answer.
fn refuse(stream: &mut TcpStream, code: u16, body: &str) -> std::io::Result<()> {
    respond(stream, code, TEXT, body, false)?;
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut chunk = [0u8; 4096];
    let mut drained = 0;
    let deadline = std::time::Instant::now() + Duration::from_millis(CLIENT_TIMEOUT_MS);
    while drained < REFUSED_DRAIN_BYTES_MAX && std::time::Instant::now() < deadline {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
    Ok(())
}

/// The type of the plain-text answers other than the metrics.
const TEXT: &str = "text/plain; charset=utf-8";

fn respond(
    stream: &mut TcpStream,
    code: u16,
    content_type: &str,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        408 => "Request Timeout",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Request Header Fields Too Large",
    };
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if code == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if !head_only {
        out.push_str(body);
    }
    stream.write_all(out.as_bytes())?;
    stream.flush()
}

/// One metric family: its samples are written together under one HELP and TYPE.
#[derive(Debug)]
struct Family {
    name: String,
    kind: &'static str,
    help: String,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

/// Collects samples by family, in first-seen order; prometheus-client encodes them
/// (`Collector`), so the exposition is always well-formed OpenMetrics.
#[derive(Debug, Default)]
struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    fn add(
        &mut self,
        name: &str,
        kind: &'static str,
        help: &str,
        labels: &[(&'static str, &str)],
        value: f64,
    ) {
        let i = match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name: name.to_string(),
                    kind,
                    help: help.to_string(),
                    samples: Vec::new(),
                });
                self.families.len() - 1
            }
        };
        let labels = labels.iter().map(|(k, v)| (*k, v.to_string())).collect();
        self.families[i].samples.push((labels, value));
    }

    fn render(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        // Writing to a String cannot fail; an error would be a bug in the encoder.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
            tracing::error!("encoding the metrics failed: {e}");
        }
        out
    }
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        for family in &self.families {
            // OpenMetrics names a counter family without its samples' `_total`.
            let (name, metric_type) = match family.kind {
                "counter" => (
                    family.name.strip_suffix("_total").unwrap_or(&family.name),
                    MetricType::Counter,
                ),
                _ => (family.name.as_str(), MetricType::Gauge),
            };
            let mut metric = encoder.encode_descriptor(name, &family.help, None, metric_type)?;
            for (labels, value) in &family.samples {
                if labels.is_empty() {
                    encode_value(metric_type, *value, metric)?;
                    break;
                }
                encode_value(metric_type, *value, metric.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

/// Whole values as integers (exact for counters up to 2^53), others as floats.
fn encode_value(kind: MetricType, value: f64, encoder: MetricEncoder) -> std::fmt::Result {
    let whole = value.fract() == 0.0 && (0.0..9.0e15).contains(&value);
    match (kind, whole) {
        (MetricType::Counter, true) => ConstCounter::new(value as u64).encode(encoder),
        (MetricType::Counter, false) => ConstCounter::new(value).encode(encoder),
        (_, true) => ConstGauge::new(value as i64).encode(encoder),
        (_, false) => ConstGauge::new(value).encode(encoder),
    }
}

/// A metric name part from a counter name: `[a-zA-Z0-9_]` only.
fn metric_part(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// HELP text of the file-system and pagepool counters of `mako diag stats`.
fn counter_help(name: &str) -> String {
    let known = match name {
        "creates" => "Files, directories and links created.",
        "removes" => "Names removed (unlink, rmdir).",
        "lookups" => "Name lookups.",
        "reads" => "Read calls served.",
        "writes" => "Write calls served.",
        "bytes_read" => "Bytes returned by reads.",
        "bytes_written" => "Bytes accepted by writes.",
        "blocks_flushed" => "Data blocks written back from the pagepool.",
        "fsyncs" => "fsync and fdatasync calls.",
        "inode_cache_hits" => "Inode lookups served from the inode cache.",
        "inode_cache_misses" => "Inode lookups that read the inode from disk.",
        "stat_cache_hits" => "Attribute requests answered from the stat cache (maxStatCache).",
        "inode_slot_rereads" => "Inodes read again alone into a cached inode-file chunk (granted to this node since the chunk was read).",
        "generation_slot_reads" => "Inode-file slots read to learn the last generation of a new inode's number (several nodes, or not cached).",
        "dir_splits" => "Directory block splits.",
        "inode_file_blocks_ahead" => "Inode-file blocks made ahead for other nodes' first inode-map segments.",
        "corruptions_detected" => "Metadata structures that failed validation when read, and integrity failures (checksum-valid metadata that says something impossible; the mount turns read-only).",
        "background_errors" => "Errors of background work (write-behind, prefetch, sync).",
        "direct_reads" => "Reads served by direct I/O (O_DIRECT), bypassing the pagepool.",
        "direct_writes" => "Writes served by direct I/O (O_DIRECT), bypassing the pagepool.",
        "pagepool_hits" => "Pagepool buffer lookups that found the buffer.",
        "pagepool_misses" => "Pagepool buffer lookups that created a buffer.",
        "pagepool_evictions" => "Clean pagepool buffers evicted to make room.",
        "prefetch_issued" => "Blocks read ahead by prefetch.",
        "prefetch_used" => "Prefetched blocks that a read then used.",
        "prefetch_wasted" => "Prefetched blocks evicted or dropped unused.",
        "writer_waits_for_writebehind" => {
            "Writes that waited for write-behind to free pagepool room."
        }
        "log_commits" => "Recovery log transactions committed (made durable).",
        "log_bytes" => "Bytes written to the recovery log.",
        "log_images" => "Metadata images (inodes, pages, blocks) logged.",
        "log_revokes" => {
            "Revoke records logged: images written in place before their token left this node."
        }
        "log_barriers" => "Disk syncs done by log commits and checkpoints.",
        "log_gate_waits" => "Operations that waited for a log commit to take its snapshot.",
        "log_checkpoints" => {
            "Checkpoints: committed metadata written in place and the log tail moved."
        }
        "log_checkpoint_bytes" => "Bytes of metadata written in place by checkpoints.",
        "log_replayed_transactions" => {
            "Log transactions replayed when this file system was mounted."
        }
        "log_replayed_images" => "Metadata images read by that replay.",
        "log_replay_revoked_images" => {
            "Images that replay skipped: revoked, as another node may have changed them since."
        }
        "log_replay_millis" => "Milliseconds the replay at mount took.",
        _ => "",
    };
    if known.is_empty() {
        format!("File-system counter {name} (mako diag stats).")
    } else {
        format!("{known} Same as {name} in mako diag stats.")
    }
}

/// Everything the exposition shows, taken from the daemon at one moment.
pub(crate) struct Figures {
    status: DaemonStatus,
    fs_counters: Vec<FsCounters>,
    locks: Vec<mako_diag::lock_stats::LockCounters>,
    /// Threads waiting now and the longest current wait.
    waiters: (usize, Duration),
}

impl Figures {
    fn of(daemon: &Daemon) -> Figures {
        Figures {
            status: daemon.status(),
            fs_counters: daemon.fs_counters(),
            locks: mako_diag::lock_stats::snapshot(),
            waiters: mako_diag::waiters::summary(),
        }
    }
}

/// The whole exposition for the daemon now.
pub fn render(daemon: &Daemon) -> String {
    render_figures(&Figures::of(daemon))
}

fn render_figures(figures: &Figures) -> String {
    let mut x = Exposition::default();
    let status = &figures.status;
    x.add("mako_up", "gauge", "1 while makod answers.", &[], 1.0);
    x.add(
        "mako_build_info",
        "gauge",
        "makod version (value 1).",
        &[("version", &status.version), ("node", &status.node_name)],
        1.0,
    );
    x.add(
        "mako_uptime_seconds",
        "gauge",
        "Seconds since makod started.",
        &[],
        status.uptime_secs as f64,
    );
    for fs in &status.filesystems {
        let l = [("fs", fs.name.as_str())];
        x.add(
            "mako_fs_mounted",
            "gauge",
            "1 if the file system is mounted on this node.",
            &l,
            if fs.mounted { 1.0 } else { 0.0 },
        );
        if !fs.mounted {
            continue;
        }
        x.add(
            "mako_fs_size_bytes",
            "gauge",
            "Capacity of the file system's disks (as mako status).",
            &l,
            fs.total_bytes as f64,
        );
        x.add(
            "mako_fs_free_bytes",
            "gauge",
            "Free space (as mako status).",
            &l,
            fs.free_bytes as f64,
        );
        x.add(
            "mako_fs_inodes_used",
            "gauge",
            "Inodes in use.",
            &l,
            fs.inodes_used as f64,
        );
        x.add(
            "mako_fs_inodes_max",
            "gauge",
            "Inodes the file system can hold.",
            &l,
            fs.inodes_max as f64,
        );
        x.add(
            "mako_pagepool_limit_bytes",
            "gauge",
            "Pagepool size (pagepool).",
            &l,
            fs.pagepool_bytes as f64,
        );
        x.add(
            "mako_pagepool_used_bytes",
            "gauge",
            "Pagepool bytes holding data.",
            &l,
            fs.pagepool_used_bytes as f64,
        );
        x.add(
            "mako_pagepool_dirty_bytes",
            "gauge",
            "Pagepool bytes not yet written back.",
            &l,
            fs.pagepool_dirty_bytes as f64,
        );
        x.add(
            "mako_fs_read_only",
            "gauge",
            "1 if the file system went read-only after an error.",
            &l,
            if fs.read_only { 1.0 } else { 0.0 },
        );
    }
    for (fs, counters, disks) in &figures.fs_counters {
        for (name, value) in counters {
            let metric = format!("mako_fs_{}_total", metric_part(name));
            x.add(
                &metric,
                "counter",
                &counter_help(name),
                &[("fs", fs)],
                *value as f64,
            );
        }
        for d in disks {
            let l = [("fs", fs.as_str()), ("disk", d.name.as_str())];
            x.add(
                "mako_disk_reads_total",
                "counter",
                "Block reads issued to the disk.",
                &l,
                d.reads as f64,
            );
            x.add(
                "mako_disk_writes_total",
                "counter",
                "Block writes issued to the disk.",
                &l,
                d.writes as f64,
            );
            x.add(
                "mako_disk_read_bytes_total",
                "counter",
                "Bytes read from the disk.",
                &l,
                d.read_bytes as f64,
            );
            x.add(
                "mako_disk_write_bytes_total",
                "counter",
                "Bytes written to the disk.",
                &l,
                d.write_bytes as f64,
            );
            x.add(
                "mako_disk_read_seconds_total",
                "counter",
                "Time spent in reads (average = this / reads).",
                &l,
                d.read_micros as f64 / 1e6,
            );
            x.add(
                "mako_disk_write_seconds_total",
                "counter",
                "Time spent in writes (average = this / writes).",
                &l,
                d.write_micros as f64 / 1e6,
            );
            x.add(
                "mako_disk_errors_total",
                "counter",
                "Failed I/Os on the disk.",
                &l,
                d.errors as f64,
            );
        }
    }
    for c in &figures.locks {
        let l = [("lock", c.name)];
        x.add(
            "mako_lock_acquisitions_total",
            "counter",
            "Acquisitions of the locks of a class (mako diag counters).",
            &l,
            c.acquisitions as f64,
        );
        x.add(
            "mako_lock_contended_total",
            "counter",
            "Acquisitions that found the lock held and waited.",
            &l,
            c.contended as f64,
        );
        x.add(
            "mako_lock_wait_seconds_total",
            "counter",
            "Time spent waiting for the locks of a class.",
            &l,
            c.wait_total_ns as f64 / 1e9,
        );
        x.add(
            "mako_lock_wait_max_seconds",
            "gauge",
            "Longest single wait for a lock of the class since makod started.",
            &l,
            c.wait_max_ns as f64 / 1e9,
        );
    }
    let (waiting, longest) = figures.waiters;
    x.add(
        "mako_waiters",
        "gauge",
        "Threads blocked now on a lock, a disk I/O, a sync or the pagepool (mako diag waiters).",
        &[],
        waiting as f64,
    );
    x.add(
        "mako_waiter_longest_seconds",
        "gauge",
        "How long the longest current waiter has waited.",
        &[],
        longest.as_secs_f64(),
    );
    x.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mako_control::{DiskStatusView, FsStatus};
    use mako_diag::lock_stats::LockCounters;
    use mako_disk::nsd::DiskStats;

    /// A daemon's figures with every kind of sample: a mounted and an unmounted file
    /// system, counters, two disks, fractional seconds, two lock classes, waiters, and
    /// label values that need escaping.
    fn fixture() -> Figures {
        let fs = |name: &str, mounted: bool| FsStatus {
            name: name.into(),
            mountpoint: format!("/mako/{name}"),
            mounted,
            block_bytes: 4 << 20,
            subblock_bytes: 128 << 10,
            inode_bytes: 4096,
            total_bytes: 32 << 30,
            free_bytes: 30 << 30,
            inodes_used: 1234,
            inodes_max: 1 << 20,
            pagepool_bytes: 1 << 30,
            pagepool_used_bytes: 300 << 20,
            pagepool_dirty_bytes: 12 << 20,
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
        };
        let disk = |name: &str, n: u64| DiskStats {
            name: name.into(),
            reads: 17 * n,
            writes: 23 * n,
            read_bytes: (17 * n) << 20,
            write_bytes: (23 * n) << 20,
            read_micros: 1_234_567 * n,
            write_micros: 250_000 * n,
            errors: n - 1,
        };
        let counters: Vec<(String, u64)> = [
            "creates",
            "removes",
            "bytes_written",
            "pagepool_hits",
            "writer_waits_for_writebehind",
            "log_commits",
            "log_replay_millis",
            "a_counter_without_help",
        ]
        .iter()
        .enumerate()
        .map(|(i, n)| (n.to_string(), (i as u64 + 1) * 1000 + 7))
        .collect();
        Figures {
            status: DaemonStatus {
                node_name: "node \"one\"\\a".into(),
                node_id: 0,
                pid: 4242,
                data_dir: "/var/lib/mako".into(),
                uptime_secs: 3725,
                version: "0.1.0".into(),
                filesystems: vec![fs("fs1", true), fs("fs2", false)],
            },
            fs_counters: vec![("fs1".into(), counters, vec![disk("d0", 1), disk("d1", 2)])],
            locks: vec![
                LockCounters {
                    name: "inode",
                    acquisitions: 3941,
                    contended: 12,
                    wait_total_ns: 1_500_000,
                    wait_max_ns: 250_000,
                },
                LockCounters {
                    name: "buffer",
                    acquisitions: 0,
                    contended: 0,
                    wait_total_ns: 0,
                    wait_max_ns: 0,
                },
            ],
            waiters: (3, Duration::from_millis(1500)),
        }
    }

    /// The exposition of the fixture as the hand-written encoder printed it (recorded
    /// before the switch to prometheus-client, `metrics_golden.txt`).
    const GOLDEN: &str = include_str!("metrics_golden.txt");

    #[test]
    fn families_are_grouped_typed_and_escaped() {
        let mut x = Exposition::default();
        x.add("a_total", "counter", "A.", &[("fs", "fs1")], 3.0);
        x.add("b", "gauge", "B.", &[], 0.25);
        x.add("a_total", "counter", "A.", &[("fs", "we\"ird\\")], 4.0);
        x.add("c_seconds_total", "counter", "C.", &[("lock", "x")], 0.5);
        let text = x.render();
        assert_eq!(
            text,
            "# HELP a A.\n# TYPE a counter\na_total{fs=\"fs1\"} 3\na_total{fs=\"we\\\"ird\\\\\"} 4\n\
             # HELP b B.\n# TYPE b gauge\nb 0.25\n\
             # HELP c_seconds C.\n# TYPE c_seconds counter\nc_seconds_total{lock=\"x\"} 0.5\n# EOF\n"
        );
        assert_eq!(metric_part("writer-waits.X"), "writer_waits_x");
    }

    /// An exposition read back: samples in order (name, labels as written, value), and
    /// each family's HELP and TYPE by family name.
    struct Parsed {
        samples: Vec<(String, String, f64)>,
        help: std::collections::HashMap<String, String>,
        types: std::collections::HashMap<String, String>,
    }

    fn parse(text: &str) -> Parsed {
        let mut parsed = Parsed {
            samples: Vec::new(),
            help: Default::default(),
            types: Default::default(),
        };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                parsed.help.insert(name.into(), help.into());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                parsed.types.insert(name.into(), kind.into());
            } else if line == "# EOF" {
                continue;
            } else {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let (name, labels) = match series.split_once('{') {
                    Some((name, labels)) => (name, labels.trim_end_matches('}')),
                    None => (series, ""),
                };
                let value: f64 = value.parse().unwrap_or_else(|e| panic!("{line}: {e}"));
                parsed.samples.push((name.into(), labels.into(), value));
            }
        }
        parsed
    }

    /// The HELP and TYPE of sample `name`: its own family, or (OpenMetrics) the counter
    /// family it is the `_total` of.
    fn family_of<'a>(parsed: &'a Parsed, name: &str) -> (&'a str, &'a str) {
        let family = if parsed.types.contains_key(name) {
            name
        } else {
            name.strip_suffix("_total").unwrap_or(name)
        };
        (
            parsed
                .help
                .get(family)
                .map(String::as_str)
                .unwrap_or("(no HELP)"),
            parsed
                .types
                .get(family)
                .map(String::as_str)
                .unwrap_or("(no TYPE)"),
        )
    }

    /// The exposition carries exactly what the hand-written encoder's did: the same
    /// samples (names, labels, values) in the same order, each with the same HELP and
    /// TYPE. Only the framing is OpenMetrics: a counter family is named without
    /// `_total` in its HELP and TYPE lines, and `# EOF` ends the text.
    #[test]
    fn the_exposition_carries_what_was_recorded() {
        let text = render_figures(&fixture());
        assert!(text.ends_with("\n# EOF\n"), "{text}");
        let (old, new) = (parse(GOLDEN), parse(&text));
        assert_eq!(new.samples.len(), old.samples.len(), "{text}");
        for (was, now) in old.samples.iter().zip(&new.samples) {
            assert_eq!(now, was);
            assert_eq!(
                family_of(&new, &now.0),
                family_of(&old, &was.0),
                "HELP and TYPE of {}",
                now.0
            );
        }
    }
}
