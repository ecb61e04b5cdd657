//! Progress of a check: phases with a done/total count. The checker calls the
//! `Progress` trait from one coordinating thread at most every `TICK_MS`; the CLI draws
//! a bar with ETA on a terminal (indicatif) and otherwise uses `JsonLines`, one
//! machine-readable line per second on stderr.

use serde::Serialize;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the coordinating thread reports while worker threads run.
pub const TICK_MS: u64 = 100;
/// Least time between two JSON progress lines of one phase.
pub const JSON_INTERVAL: Duration = Duration::from_secs(1);

/// The phases of a run, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Disk headers and descriptor copies.
    Superblock,
    /// Inode file, allocation maps, log state.
    MetadataFiles,
    /// Every inode slot, in parallel over inode ranges (the long phase).
    Inodes,
    /// Directory entries: reachability, link counts, parents, orphans.
    Namespace,
    /// Block and inode allocation maps against what is in use.
    Space,
    /// Writing repairs (`-y`).
    Repair,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Superblock => "superblock",
            Phase::MetadataFiles => "metadata_files",
            Phase::Inodes => "inodes",
            Phase::Namespace => "namespace",
            Phase::Space => "space",
            Phase::Repair => "repair",
        }
    }
    /// Human label for a progress bar.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Superblock => "descriptor and disk headers",
            Phase::MetadataFiles => "metadata files",
            Phase::Inodes => "inodes",
            Phase::Namespace => "directories and links",
            Phase::Space => "allocation maps",
            Phase::Repair => "repairing",
        }
    }
}

/// Receives progress. Implementations must be cheap: it is called every `TICK_MS`.
pub trait Progress: Send + Sync {
    /// `done` of `total` units of `phase` (units: inode slots, entries, regions, steps).
    fn update(&self, phase: Phase, done: u64, total: u64);
    /// The run is over (clear a bar, flush a stream).
    fn finish(&self) {}
}

/// No progress output (tests, library callers).
pub struct NoProgress;

impl Progress for NoProgress {
    fn update(&self, _phase: Phase, _done: u64, _total: u64) {}
}

/// One JSON object per line:
/// `{"phase":"inodes","done":1200,"total":5000,"elapsed_secs":1.02}`, at most one a
/// second per phase plus the first and last of every phase.
/// The last line printed: its phase, when, and its count.
type LastLine = Option<(Phase, Instant, u64)>;

pub struct JsonLines<W: Write + Send> {
    out: Mutex<(W, LastLine)>,
    start: Instant,
}

#[derive(Serialize)]
struct Line {
    phase: Phase,
    done: u64,
    total: u64,
    elapsed_secs: f64,
}

impl<W: Write + Send> JsonLines<W> {
    pub fn new(out: W) -> Self {
        JsonLines {
            out: Mutex::new((out, None)),
            start: Instant::now(),
        }
    }
}

impl<W: Write + Send> Progress for JsonLines<W> {
    fn update(&self, phase: Phase, done: u64, total: u64) {
        // A panic while printing progress leaves the stream usable.
        let mut g = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let (out, last) = &mut *g;
        let now = Instant::now();
        let due = match last {
            Some((p, t, d)) if *p == phase => {
                (now.duration_since(*t) >= JSON_INTERVAL && done != *d)
                    || (done >= total && *d < total)
            }
            _ => true,
        };
        if !due {
            return;
        }
        *last = Some((phase, now, done));
        let line = Line {
            phase,
            done,
            total,
            elapsed_secs: (now - self.start).as_secs_f64(),
        };
        if let Ok(text) = serde_json::to_string(&line) {
            // Progress is advisory: a closed stderr must not stop a repair.
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_are_rate_limited_and_parse() {
        let sink = Sink::default();
        let p = JsonLines::new(sink.clone());
        p.update(Phase::Inodes, 0, 100);
        for i in 1..50 {
            p.update(Phase::Inodes, i, 100); // within a second: suppressed
        }
        p.update(Phase::Inodes, 100, 100); // the last of the phase: always shown
        p.update(Phase::Namespace, 0, 7); // a new phase: always shown
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0]["phase"], "inodes");
        assert_eq!(lines[1]["done"], 100);
        assert_eq!(lines[2]["phase"], "namespace");
        assert!(lines[2]["elapsed_secs"].as_f64().unwrap() >= 0.0);
    }
}
