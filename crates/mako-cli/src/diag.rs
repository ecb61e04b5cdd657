//! `mako diag …`: diagnostics from the running daemon, printed as tables in the style
//! of mmdiag, or as JSON with `--json`.

use std::process::ExitCode;

use anyhow::Result;
use mako_control::{
    ConfigRowView, IoRecordView, LockCounterView, Request, Response, StatsView, TokenView,
    WaiterView,
};
use serde_json::json;

use crate::cli::{Context, DiagCommand};
use crate::daemon::{connect, unexpected};
use crate::table::Table;
use crate::units::{human_bytes, local_time_micros};

/// Runs one `mako diag` command.
pub fn run(context: &Context, command: DiagCommand) -> Result<ExitCode> {
    let (request, json) = match &command {
        DiagCommand::Iohist { last, output } => (Request::DiagIohist { last: *last }, output.json),
        DiagCommand::Waiters {
            threshold_ms,
            output,
        } => (
            Request::DiagWaiters {
                threshold_ms: *threshold_ms,
            },
            output.json,
        ),
        DiagCommand::Counters { output } => (Request::DiagCounters, output.json),
        DiagCommand::Stats { output } => (Request::DiagStats, output.json),
        DiagCommand::Tokens { output } => (Request::DiagTokens, output.json),
        DiagCommand::Config { output } => (Request::DiagConfig, output.json),
    };
    let mut client = connect(&context.data)?;
    let response = client.call(&request)?;
    if let Response::Error { message } = &response {
        anyhow::bail!("makod: {message}");
    }
    let text = match (&command, &response) {
        (_, response) if json => json_of(response),
        (DiagCommand::Iohist { .. }, Response::Iohist(records)) => render_iohist(records),
        (DiagCommand::Waiters { threshold_ms, .. }, Response::Waiters(waiters)) => {
            render_waiters(waiters, *threshold_ms)
        }
        (DiagCommand::Counters { .. }, Response::Counters(counters)) => render_counters(counters),
        (DiagCommand::Stats { .. }, Response::Stats(stats)) => render_stats(stats),
        (DiagCommand::Tokens { .. }, Response::Tokens(tokens)) => render_tokens(tokens),
        (DiagCommand::Config { .. }, Response::Config(rows)) => render_config(rows),
        (_, other) => return Err(unexpected(&request, other)),
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// The payload of a response as pretty JSON (the view structs, not the envelope).
fn json_of(response: &Response) -> String {
    let value = match response {
        Response::Iohist(v) => json!(v),
        Response::Waiters(v) => json!(v),
        Response::Counters(v) => json!(v),
        Response::Stats(v) => json!(v),
        Response::Tokens(v) => json!(v),
        Response::Config(v) => json!(v),
        other => json!(other),
    };
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| "null".into());
    text.push('\n');
    text
}

fn ms(value: f64) -> String {
    format!("{value:.3}")
}

/// iohist in the mmdiag layout.
pub fn render_iohist(records: &[IoRecordView]) -> String {
    let mut out = format!(
        "=== mmdiag: iohist ===\n\nI/O history: {} most recent I/Os\n\n",
        records.len()
    );
    if records.is_empty() {
        out.push_str("No I/O recorded (iohistSize=0 turns the history off).\n");
        return out;
    }
    let mut table = Table::new(&[
        "I/O start time",
        "RW",
        "Buf type",
        "disk:sectorNum",
        "nSec",
        "time ms",
        "queue ms",
        "thread",
        "inode",
        "result",
    ])
    .right_align(&[3, 4, 5, 6, 8]);
    for r in records {
        table.row(vec![
            local_time_micros(r.start_unix_micros, false),
            if r.write { "W" } else { "R" }.to_string(),
            r.buffer_type.clone(),
            format!("{}:{}", r.disk, r.sector),
            r.sectors.to_string(),
            ms(r.service_ms),
            ms(r.queue_ms),
            r.thread.clone(),
            r.ino.map_or("-".to_string(), |i| i.to_string()),
            if r.ok { "ok" } else { "ERROR" }.to_string(),
        ]);
    }
    out.push_str(&table.render());
    let failed = records.iter().filter(|r| !r.ok).count();
    if failed > 0 {
        out.push_str(&format!(
            "\n{failed} I/O(s) failed: check the disks (`mako disk show`) and makod.log.\n"
        ));
    }
    out
}

pub fn render_waiters(waiters: &[WaiterView], threshold_ms: u64) -> String {
    let mut out = String::from("=== mmdiag: waiters ===\n");
    if waiters.is_empty() {
        out.push_str(&format!(
            "No thread has waited {threshold_ms} ms or more.\n"
        ));
        return out;
    }
    let mut sorted: Vec<&WaiterView> = waiters.iter().collect();
    sorted.sort_by(|a, b| b.waiting_ms.total_cmp(&a.waiting_ms));
    for w in sorted {
        out.push_str(&format!(
            "Waiting {:.4} sec, thread {}: {}\n",
            w.waiting_ms / 1000.0,
            w.thread,
            w.what
        ));
    }
    out
}

pub fn render_counters(counters: &[LockCounterView]) -> String {
    let mut table = Table::new(&[
        "Lock",
        "Acquisitions",
        "Contended",
        "Contended%",
        "Wait total ms",
        "Wait max ms",
    ])
    .right_align(&[1, 2, 3, 4, 5]);
    let mut sorted: Vec<&LockCounterView> = counters.iter().collect();
    sorted.sort_by(|a, b| b.wait_total_ms.total_cmp(&a.wait_total_ms));
    for c in sorted {
        let pct = if c.acquisitions == 0 {
            0.0
        } else {
            c.contended as f64 * 100.0 / c.acquisitions as f64
        };
        table.row(vec![
            c.name.clone(),
            c.acquisitions.to_string(),
            c.contended.to_string(),
            format!("{pct:.1}%"),
            ms(c.wait_total_ms),
            ms(c.wait_max_ms),
        ]);
    }
    format!(
        "=== mmdiag: lock counters (most waited first) ===\n{}",
        table.render()
    )
}

pub fn render_stats(stats: &StatsView) -> String {
    let mut out = String::from("=== mmdiag: stats ===\n");
    for fs in &stats.filesystems {
        out.push_str(&format!("\nFile system {}\n", fs.name));
        let mut table = Table::new(&["Counter", "Value"]).right_align(&[1]);
        for (name, value) in &fs.counters {
            table.row(vec![name.clone(), value.to_string()]);
        }
        out.push_str(&table.render());
    }
    let mut table = Table::new(&[
        "Disk",
        "Reads",
        "Writes",
        "Read",
        "Written",
        "Read ms avg",
        "Write ms avg",
        "Errors",
    ])
    .right_align(&[1, 2, 3, 4, 5, 6, 7]);
    for d in &stats.disks {
        table.row(vec![
            d.name.clone(),
            d.reads.to_string(),
            d.writes.to_string(),
            human_bytes(d.read_bytes),
            human_bytes(d.write_bytes),
            ms(d.read_ms_avg),
            ms(d.write_ms_avg),
            d.errors.to_string(),
        ]);
    }
    out.push_str("\nDisks\n");
    out.push_str(&table.render());
    if stats.disks.iter().any(|d| d.errors > 0) {
        out.push_str("\nDisk errors seen: see `mako diag iohist` and makod.log.\n");
    }
    out
}

pub fn render_tokens(tokens: &[TokenView]) -> String {
    // The manager column only in a multi-process cluster (a lone makod is its own
    // manager).
    let sharded = tokens.iter().any(|t| !t.manager.is_empty());
    let mut table = if sharded {
        Table::new(&["Resource", "Manager", "Holders"])
    } else {
        Table::new(&["Resource", "Holders"])
    };
    for t in tokens {
        let mut row = vec![t.resource.clone()];
        if sharded {
            row.push(t.manager.clone());
        }
        row.push(t.holders.join(", "));
        table.row(row);
    }
    format!(
        "=== mmdiag: tokens ({} held) ===\n{}",
        tokens.len(),
        table.render()
    )
}

pub fn render_config(rows: &[ConfigRowView]) -> String {
    let mut table = Table::new(&[
        "Parameter",
        "Value",
        "Source",
        "Default",
        "Range",
        "Changes",
    ]);
    for r in rows {
        table.row(vec![
            r.name.clone(),
            r.value.clone(),
            r.source.clone(),
            r.default.clone(),
            r.range.clone(),
            r.apply.clone(),
        ]);
    }
    format!("=== mmdiag: config (running makod) ===\n{}", table.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iohist_columns() {
        let text = render_iohist(&[IoRecordView {
            start_unix_micros: 1_700_000_000_000_001,
            write: true,
            buffer_type: "data".into(),
            disk: 2,
            sector: 81920,
            sectors: 8192,
            service_ms: 1.25,
            queue_ms: 0.5,
            thread: "writebehind-1".into(),
            ino: Some(1234),
            ok: false,
        }]);
        assert!(text.contains("2:81920"), "{text}");
        assert!(text.contains("1.250"), "{text}");
        assert!(text.contains("ERROR"), "{text}");
        assert!(text.contains("1 I/O(s) failed"), "{text}");
        assert!(text.contains(".000001"), "{text}");
    }

    #[test]
    fn waiters_sorted_longest_first() {
        let text = render_waiters(
            &[
                WaiterView {
                    thread: "a".into(),
                    waiting_ms: 5.0,
                    what: "x".into(),
                },
                WaiterView {
                    thread: "b".into(),
                    waiting_ms: 1500.0,
                    what: "token".into(),
                },
            ],
            0,
        );
        let first = text.lines().nth(1).unwrap();
        assert!(first.contains("1.5000 sec"), "{text}");
        assert!(first.contains("thread b: token"), "{text}");
        assert!(render_waiters(&[], 100).contains("No thread has waited 100 ms"));
    }

    #[test]
    fn json_is_the_payload() {
        let text = json_of(&Response::Tokens(vec![TokenView {
            resource: "r".into(),
            manager: String::new(),
            holders: vec!["n1 rw".into()],
        }]));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value[0]["resource"], "r");
    }
}
