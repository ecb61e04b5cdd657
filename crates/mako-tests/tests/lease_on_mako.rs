//! Leases, expel and fencing with real processes (docs/cluster.md "Leases, expel and
//! fencing"): a client node without disk access of its own is paused (SIGSTOP) for
//! longer than its lease; the cluster manager expels it and recovers it (node 0 reads
//! what it fsynced while it is still paused); resumed (SIGCONT), it cannot
//! write — its mount returns EIO (or EROFS) and nothing it wrote after the expel reaches the
//! disks —, and once restarted it rejoins at a new lease epoch and works again.
//!
//! `failureDetectionTime` is 10 s (its minimum) and `minMissedPingTimeout` 2 s, so the
//! pause lasts about 15 s. Every wait is a deadline used only as a hang guard: the
//! test waits for states (`mako node show` says expelled), never for durations.

use mako_tests::cluster::require_fuse;
use mako_tests::netcluster::{line_of, NetCluster, NetClusterOptions};
use mako_tests::workload::write_synced;
use std::time::{Duration, Instant};

/// Hang guard of each wait for a state.
const WAIT: Duration = Duration::from_secs(180);

fn wait_for(c: &NetCluster, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < WAIT,
            "{what}: not reached within the {WAIT:?} hang guard\n{}",
            c.logs_tail(30)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn a_paused_node_is_expelled_cannot_write_and_rejoins() {
    if !require_fuse("a_paused_node_is_expelled_cannot_write_and_rejoins") {
        return;
    }
    let mut c = NetCluster::up(NetClusterOptions::leased(2, "1G", 10, 2))
        .expect("two nodes up: node0 the cluster manager and NSD server, node1 a diskless client");
    let before = c.node_show();
    assert!(
        line_of(&before, "node1").contains("active"),
        "node1 is not active before the pause:\n{before}"
    );

    // What node 1 made durable before its pause.
    let f1 = c.mount(1).join("f");
    let first = vec![b'A'; 200_000];
    write_synced(&f1, &first).expect("node 1 writes and fsyncs f");

    // Pause node 1 until the manager expels it.
    c.signal(1, libc::SIGSTOP).expect("SIGSTOP node 1");
    wait_for(&c, "node1 shown expelled", || {
        line_of(&c.node_show(), "node1").contains("expelled by node0")
    });
    let log0 = std::fs::read_to_string(c.node_dir(0).join("makod.log")).unwrap_or_default();
    assert!(
        log0.lines()
            .any(|l| l.contains("node 1 expelled by node 0") && l.contains("no lease renewal")),
        "node0's makod.log does not say who expelled node 1 and why:\n{}",
        c.log_tail(0, 30)
    );
    // The manager recovers node 1 (its log replayed, its tokens released) while node 1
    // is still paused: node 0 then reads what node 1 fsynced, without node 1.
    wait_for(&c, "node 0 recovers node 1", || {
        std::fs::read_to_string(c.node_dir(0).join("makod.log"))
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("node 1 (lease epoch") && l.contains("recovered in"))
    });
    let read0 = std::fs::read(c.mount(0).join("f")).expect("node 0 reads f after the recovery");
    assert!(
        read0 == first,
        "node 0 reads {} bytes in f after node 1's recovery, not the 200,000 'A's node 1 \
         fsynced before its pause",
        read0.len()
    );
    c.signal(1, libc::SIGCONT).expect("SIGCONT node 1");

    // Resumed, node 1 is fenced: its write cannot become durable.
    let second = vec![b'B'; 200_000];
    let err =
        write_synced(&f1, &second).expect_err("node 1 wrote and fsynced after it was expelled");
    // EIO from the fenced disk, or EROFS once the core turned the file system
    // read-only at its first refused log write (docs/cluster.md).
    assert!(
        matches!(err.raw_os_error(), Some(libc::EIO) | Some(libc::EROFS)),
        "node 1's write after the expel failed, but not with EIO or EROFS: {err}"
    );
    wait_for(&c, "node 1 logs its expel", || {
        std::fs::read_to_string(c.node_dir(1).join("makod.log"))
            .unwrap_or_default()
            .contains("was expelled by node 0")
    });

    // Rejoin: node 1 restarted mounts at a new lease epoch.
    let out = c
        .mako(&["shutdown", "-N", "node1"])
        .expect("mako shutdown -N node1");
    assert!(out.success(), "mako shutdown -N node1: {out}");
    let out = c
        .mako(&["startup", "-N", "node1"])
        .expect("mako startup -N node1");
    assert!(
        out.success(),
        "mako startup -N node1: {out}\n{}",
        c.logs_tail(30)
    );
    wait_for(&c, "node1 active again", || {
        let show = c.node_show();
        let line = line_of(&show, "node1");
        line.contains("active") && !line.contains("expelled")
    });

    // Nothing node 1 wrote after its expel reached the disk: node 0 reads the first
    // contents, and so does node 1 after its rejoin.
    let f0 = c.mount(0).join("f");
    let read0 = std::fs::read(&f0).expect("node 0 reads f");
    assert!(
        read0 == first,
        "node 0 reads {} bytes starting {:?} in f, not the 200,000 'A's node 1 fsynced \
         before its expel: a fenced write reached the disk",
        read0.len(),
        &read0[..read0.len().min(8)]
    );
    // Node 1 works again.
    let third = vec![b'C'; 100_000];
    write_synced(&f1, &third).expect("node 1 writes after it rejoined");
    assert!(std::fs::read(&f0).expect("node 0 reads f again") == third);
    c.finish().expect("mako down and fsck clean");
}
