//! The Prometheus endpoint: `GET /metrics` in the text exposition format (version
//! 0.0.4), with the figures of `mako diag stats`, `mako diag counters` and
//! `mako diag waiters`, and the space and pagepool gauges of `mako status`.
//!
//! A deliberately small HTTP/1.1 server on `std::net::TcpListener`: one thread, one
//! request per connection (`Connection: close`), bounded request size and time, so
//! a slow or hostile client cannot hold memory or the thread for long. Scrapes are
//! rare (seconds apart) and cheap, which is why one thread is enough and why no HTTP
//! crate is pulled in. It listens on loopback unless `prometheusAddress` says otherwise.

use crate::daemon::Daemon;
use std::fmt::Write as _;
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

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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

/// Reads one request head and answers it.
fn serve_one(mut stream: TcpStream, daemon: &Daemon) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(CLIENT_TIMEOUT_MS)))?;
    stream.set_write_timeout(Some(Duration::from_millis(CLIENT_TIMEOUT_MS)))?;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() >= REQUEST_HEAD_BYTES_MAX {
            return respond(
                &mut stream,
                431,
                "text/plain",
                "request head too large\n",
                false,
            );
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let mut parts = text.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let head_only = method == "HEAD";
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            respond(&mut stream, 200, CONTENT_TYPE, &render(daemon), head_only)
        }
        ("GET" | "HEAD", "/") => respond(
            &mut stream,
            200,
            "text/plain; charset=utf-8",
            "Mako metrics: GET /metrics\n",
            head_only,
        ),
        ("GET" | "HEAD", _) => respond(
            &mut stream,
            404,
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n",
            head_only,
        ),
        _ => respond(
            &mut stream,
            405,
            "text/plain; charset=utf-8",
            "only GET and HEAD are served\n",
            false,
        ),
    }
}

fn respond(
    stream: &mut TcpStream,
    code: u16,
    content_type: &str,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
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
struct Family {
    name: String,
    kind: &'static str,
    help: String,
    samples: Vec<String>,
}

/// Collects samples by family, in first-seen order, and renders the exposition.
#[derive(Default)]
struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    fn add(
        &mut self,
        name: &str,
        kind: &'static str,
        help: &str,
        labels: &[(&str, &str)],
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
        let mut line = String::from(name);
        if !labels.is_empty() {
            line.push('{');
            for (k, (key, v)) in labels.iter().enumerate() {
                if k > 0 {
                    line.push(',');
                }
                let _ = write!(line, "{key}=\"{}\"", escape_label(v));
            }
            line.push('}');
        }
        let _ = write!(line, " {}", format_value(value));
        self.families[i].samples.push(line);
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let _ = writeln!(
                out,
                "# HELP {} {}",
                f.name,
                f.help.replace('\\', "\\\\").replace('\n', "\\n")
            );
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
            for s in &f.samples {
                out.push_str(s);
                out.push('\n');
            }
        }
        out
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Integers exactly (counters up to 2^53 are exact in f64), others in Rust's shortest
/// round-trip form, which Prometheus parses.
fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
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
        "stat_cache_hits" => "Inode lookups served from the stat cache (maxStatCache).",
        "dir_splits" => "Directory block splits.",
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
        "log_barriers" => "Disk syncs done by log commits and checkpoints.",
        "log_gate_waits" => "Operations that waited for a log commit to take its snapshot.",
        "log_checkpoints" => {
            "Checkpoints: committed metadata written in place and the log tail moved."
        }
        "log_checkpoint_bytes" => "Bytes of metadata written in place by checkpoints.",
        "log_replayed_transactions" => {
            "Log transactions replayed when this file system was mounted."
        }
        "log_replayed_images" => "Metadata images written by that replay.",
        "log_replay_millis" => "Milliseconds the replay at mount took.",
        _ => "",
    };
    if known.is_empty() {
        format!("File-system counter {name} (mako diag stats).")
    } else {
        format!("{known} Same as {name} in mako diag stats.")
    }
}

/// The whole exposition for the daemon now.
pub fn render(daemon: &Daemon) -> String {
    let mut x = Exposition::default();
    let status = daemon.status();
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
    for (fs, counters, disks) in daemon.fs_counters() {
        for (name, value) in &counters {
            let metric = format!("mako_fs_{}_total", metric_part(name));
            x.add(
                &metric,
                "counter",
                &counter_help(name),
                &[("fs", &fs)],
                *value as f64,
            );
        }
        for d in &disks {
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
    for c in mako_diag::lock_stats::snapshot() {
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
    let (waiting, longest) = mako_diag::waiters::summary();
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

    #[test]
    fn families_are_grouped_typed_and_escaped() {
        let mut x = Exposition::default();
        x.add("a_total", "counter", "A.", &[("fs", "fs1")], 3.0);
        x.add("b", "gauge", "B.", &[], 0.25);
        x.add("a_total", "counter", "A.", &[("fs", "we\"ird\\")], 4.0);
        let text = x.render();
        assert_eq!(
            text,
            "# HELP a_total A.\n# TYPE a_total counter\na_total{fs=\"fs1\"} 3\na_total{fs=\"we\\\"ird\\\\\"} 4\n\
             # HELP b B.\n# TYPE b gauge\nb 0.25\n"
        );
        assert_eq!(metric_part("writer-waits.X"), "writer_waits_x");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(12345678.0), "12345678");
    }
}
