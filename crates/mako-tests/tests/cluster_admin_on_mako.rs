//! The cluster's replicated configuration and its admin commands, on real makod
//! processes (`mako up --nodes 3`: three quorum nodes on loopback). Every node runs a
//! member of the quorum; the raft leader is the cluster manager; a parameter set with
//! `mako config set [-N nodes]` is a raft change that every node applies; `mako node
//! show` asks every node over the network and says why one does not answer; a change
//! without a majority of the quorum nodes is refused with the nodes named.
//!
//! No timing is asserted: each wait for the cluster to converge is a poll with a
//! generous deadline that only guards against a hang. The NetCluster guard stops every
//! process and unmounts everything even when a test fails (and prints every node's
//! log tail then).

use mako_tests::cluster::{is_mounted, require_fuse, CmdOutput};
use mako_tests::netcluster::{NetCluster, NetClusterOptions};
use std::path::Path;
use std::time::{Duration, Instant};

/// The hang guard of every wait for the cluster to converge (an election, a change
/// reaching a node). Generous: CI is a loaded 2-core machine.
const CONVERGE: Duration = Duration::from_secs(180);

fn up() -> NetCluster {
    NetCluster::up(NetClusterOptions {
        disk_size: "1G".into(),
        ..NetClusterOptions::default()
    })
    .expect("three nodes up")
}

fn ok(c: &NetCluster, args: &[&str]) -> CmdOutput {
    let out = c.mako(args).unwrap();
    assert!(
        out.success(),
        "mako {}: {out}\n{}",
        args.join(" "),
        c.logs_tail(20)
    );
    out
}

/// Polls `probe` until it returns `Some`, or fails the test after `CONVERGE`, showing
/// the last thing it saw.
fn wait_for<T>(c: &NetCluster, what: &str, mut probe: impl FnMut() -> Result<T, String>) -> T {
    let started = Instant::now();
    loop {
        match probe() {
            Ok(v) => return v,
            Err(last) => {
                if started.elapsed() > CONVERGE {
                    panic!(
                        "{what}: not within {CONVERGE:?}; last seen:\n{last}\n{}",
                        c.logs_tail(30)
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Waits until `mako node show` shows a cluster manager, a created configuration and
/// `active` of the nodes active; returns its output.
fn wait_active(c: &NetCluster, active: u32) -> String {
    let want = format!("{active} of {} nodes active", c.nodes());
    wait_for(c, &want, || {
        let out = c.mako(&["node", "show"]).map_err(|e| e.to_string())?;
        let text = format!("{out}");
        if out.success()
            && out.stdout.contains(&want)
            && out.stdout.contains("cluster manager: node")
            && !out.stdout.contains("not created yet")
        {
            Ok(out.stdout)
        } else {
            Err(text)
        }
    })
}

/// The value node `i`'s running makod uses for `param` (`mako diag config`).
fn running_value(c: &NetCluster, i: u32, param: &str) -> Result<String, String> {
    let out = c
        .mako_in(&c.node_dir(i), &["diag", "config"])
        .map_err(|e| e.to_string())?;
    if !out.success() {
        return Err(format!("{out}"));
    }
    out.stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(param))
        .and_then(|l| l.split_whitespace().nth(1).map(String::from))
        .ok_or_else(|| format!("no {param} in:\n{}", out.stdout))
}

/// Waits until node `i` runs with `param` = `value` and has it in its config.toml.
fn wait_value(c: &NetCluster, i: u32, param: &str, value: &str) {
    wait_for(
        c,
        &format!("node{i} running with {param} = {value}"),
        || {
            let v = running_value(c, i, param)?;
            if v != value {
                return Err(format!("node{i} runs with {param} = {v}"));
            }
            let saved = std::fs::read_to_string(c.node_dir(i).join("config.toml"))
                .map_err(|e| e.to_string())?;
            if !saved.contains(param) || !saved.contains(value) {
                return Err(format!("node{i}'s config.toml:\n{saved}"));
            }
            Ok(())
        },
    )
}

fn node_line<'a>(show: &'a str, node: &str) -> &'a str {
    show.lines()
        .find(|l| l.split_whitespace().next() == Some(node))
        .unwrap_or_else(|| panic!("no line of {node} in:\n{show}"))
}

#[test]
fn the_quorum_elects_a_manager_and_every_node_applies_cluster_and_node_parameters() {
    if !require_fuse(
        "the_quorum_elects_a_manager_and_every_node_applies_cluster_and_node_parameters",
    ) {
        return;
    }
    let c = up();
    let show = wait_active(&c, 3);
    // One cluster manager among the quorum nodes, every node at the same epoch.
    let managers = (0..3)
        .filter(|i| node_line(&show, &format!("node{i}")).contains("active, cluster manager"))
        .count();
    assert_eq!(managers, 1, "{show}");
    for i in 0..3 {
        let line = node_line(&show, &format!("node{i}"));
        assert!(line.contains("quorum"), "{line}");
    }
    // The seeded configuration: the cluster, three nodes, two disks, one file system.
    assert!(show.contains("configuration epoch"), "{show}");

    // Cluster-wide, then a per-node override; each running daemon takes it at once.
    let out = ok(&c, &["config", "set", "maxMBpS=1234"]);
    assert!(out.stdout.contains("on every node"), "{out}");
    let out = ok(&c, &["config", "set", "maxMBpS=2222", "-N", "node1"]);
    assert!(out.stdout.contains("on node1"), "{out}");
    wait_value(&c, 0, "maxMBpS", "1234");
    wait_value(&c, 1, "maxMBpS", "2222");
    wait_value(&c, 2, "maxMBpS", "1234");
    let show = ok(&c, &["node", "show"]).stdout;
    assert!(
        show.lines()
            .any(|l| l.contains("maxMBpS") && l.contains("2222") && l.contains("node1")),
        "{show}"
    );
    // Node 1's own value goes: it falls back to the cluster-wide one.
    ok(&c, &["config", "unset", "maxMBpS", "-N", "node1"]);
    wait_value(&c, 1, "maxMBpS", "1234");
    // Asked through another node's data directory: the same configuration.
    let out = c.mako_in(&c.node_dir(2), &["node", "show"]).unwrap();
    assert!(
        out.success() && out.stdout.contains("3 of 3 nodes active"),
        "{out}"
    );

    // Refusals that say what is wrong.
    let out = c
        .mako(&["config", "set", "maxMBpS=5", "-N", "nosuch"])
        .unwrap();
    assert!(!out.success(), "{out}");
    assert!(
        out.stderr.contains("nosuch") && out.stderr.contains("node0"),
        "{out}"
    );
    let out = c.mako(&["config", "set", "maxMBpS=0"]).unwrap();
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("maxMBpS"), "{out}");

    // `mako status` shows the whole cluster with the quorum's view.
    let st = ok(&c, &["status"]).stdout;
    assert!(
        st.contains("Cluster manager: node") && st.contains("Quorum state"),
        "{st}"
    );
    c.finish().expect("down and fsck clean");
}

#[test]
fn a_stopped_node_is_shown_down_catches_up_and_a_lost_quorum_is_refused_by_name() {
    if !require_fuse("a_stopped_node_is_shown_down_catches_up_and_a_lost_quorum_is_refused_by_name")
    {
        return;
    }
    let c = up();
    wait_active(&c, 3);
    // The token manager's node cannot stop while the others run.
    let out = c.mako(&["shutdown", "-N", "node0"]).unwrap();
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("token manager"), "{out}");
    assert!(is_mounted(&c.mount(0)));

    ok(&c, &["shutdown", "-N", "node2"]);
    assert!(!is_mounted(&c.mount(2)));
    let show = wait_active(&c, 2);
    assert!(
        node_line(&show, "node2").contains("down: not running"),
        "{show}"
    );
    // Two of three quorum nodes: changes go on, and node 2 learns them when it is back.
    ok(&c, &["config", "set", "maxMBpS=3333"]);
    wait_value(&c, 0, "maxMBpS", "3333");

    // One of three: no quorum. Refused, naming the nodes that do not answer.
    ok(&c, &["shutdown", "-N", "node1"]);
    let out = c.mako(&["config", "set", "maxMBpS=4444"]).unwrap();
    assert!(!out.success(), "{out}");
    assert!(
        out.stderr.contains("quorum lost") || out.stderr.contains("no cluster manager"),
        "{out}"
    );
    if out.stderr.contains("quorum lost") {
        assert!(
            out.stderr.contains("node1") && out.stderr.contains("node2"),
            "{out}"
        );
    }
    // The file system on node 0 still works without the quorum (tokens are not
    // configuration).
    std::fs::write(c.mount(0).join("alone"), b"node 0 alone").unwrap();

    ok(&c, &["startup", "-N", "node1,node2"]);
    assert!(is_mounted(&c.mount(1)) && is_mounted(&c.mount(2)));
    wait_active(&c, 3);
    wait_value(&c, 2, "maxMBpS", "3333");
    wait_value(&c, 1, "maxMBpS", "3333");
    assert_eq!(
        std::fs::read(c.mount(2).join("alone")).unwrap(),
        b"node 0 alone"
    );
    // And the quorum takes changes again.
    ok(&c, &["config", "set", "maxMBpS=4444"]);
    for i in 0..3 {
        wait_value(&c, i, "maxMBpS", "4444");
    }
    // Each node keeps the configuration in its own store.
    for i in 0..3 {
        let store = c.node_dir(i).join("cluster.redb");
        assert!(Path::new(&store).is_file(), "{}", store.display());
    }
    c.finish().expect("down and fsck clean");
}

/// Kills the child process when dropped (a process holding a mount busy).
struct Holder(std::process::Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fails(c: &NetCluster, args: &[&str]) -> String {
    let out = c.mako(args).unwrap();
    assert!(!out.success(), "mako {} succeeded: {out}", args.join(" "));
    format!("{out}")
}

/// The first 8 bytes of a disk file (`MAKODISK` while it holds a file system).
fn disk_magic(c: &NetCluster, disk: &str) -> Vec<u8> {
    let bytes = std::fs::read(c.data_dir().join("disks").join(format!("{disk}.img")))
        .map(|b| b[..8].to_vec());
    bytes.unwrap()
}

#[test]
fn file_systems_mount_and_unmount_per_node_and_disks_and_file_systems_are_deleted_when_free() {
    if !require_fuse(
        "file_systems_mount_and_unmount_per_node_and_disks_and_file_systems_are_deleted_when_free",
    ) {
        return;
    }
    let mut c = up();
    let show = wait_active(&c, 3);
    assert!(show.contains("File systems: fs1 (disks d0, d1)"), "{show}");

    // From the cluster's own directory a node must be named.
    let text = fails(&c, &["fs", "unmount", "fs1"]);
    assert!(text.contains("-N") && text.contains("-a"), "{text}");
    // Unmounted on node 1 only; the others keep it.
    let out = ok(&c, &["fs", "unmount", "fs1", "-N", "node1"]);
    assert!(out.stdout.contains("node1: fs1 unmounted"), "{out}");
    assert!(!is_mounted(&c.mount(1)) && is_mounted(&c.mount(0)) && is_mounted(&c.mount(2)));
    let st = ok(&c, &["status"]).stdout;
    assert!(
        st.lines()
            .any(|l| l.starts_with("node1") && l.contains("not mounted")),
        "{st}"
    );

    // A busy mount is not unmounted, and the error names the process that holds it.
    let holder = Holder(
        std::process::Command::new("sleep")
            .arg("600")
            .current_dir(c.mount(2))
            .spawn()
            .unwrap(),
    );
    let text = fails(&c, &["fs", "unmount", "fs1", "-N", "node2"]);
    assert!(
        text.contains("busy") && text.contains(&format!("pid {} (sleep)", holder.0.id())),
        "{text}"
    );
    assert!(is_mounted(&c.mount(2)));
    drop(holder);

    // In use: neither the file system nor its disks can be deleted.
    let text = fails(&c, &["fs", "delete", "fs1"]);
    assert!(
        text.contains("mounted on node0, node2")
            && text.contains("mako fs unmount fs1 -N node0,node2"),
        "{text}"
    );
    let text = fails(&c, &["disk", "delete", "d0"]);
    assert!(
        text.contains("belongs to file system fs1") && text.contains("mako fs delete fs1"),
        "{text}"
    );

    // Mounted again on node 1: data written there is read on node 0.
    let out = ok(&c, &["fs", "mount", "fs1", "-N", "node1"]);
    assert!(out.stdout.contains("node1: fs1 mounted on"), "{out}");
    std::fs::write(c.mount(1).join("from1"), b"written on node 1").unwrap();
    assert_eq!(
        std::fs::read(c.mount(0).join("from1")).unwrap(),
        b"written on node 1"
    );
    // A node whose makod is down: said, with what to do; it mounts when started.
    ok(&c, &["shutdown", "-N", "node2"]);
    let text = fails(&c, &["fs", "mount", "fs1", "-N", "node2"]);
    assert!(
        text.contains("node2: not running") && text.contains("mako startup -N node2"),
        "{text}"
    );
    ok(&c, &["startup", "-N", "node2"]);
    assert!(is_mounted(&c.mount(2)));
    let text = fails(&c, &["fs", "mount", "fs1", "-N", "nosuch"]);
    assert!(text.contains("nosuch") && text.contains("node0"), "{text}");

    // Unmounted everywhere: then it can be deleted, and its disks after it.
    let out = ok(&c, &["fs", "unmount", "fs1", "-a"]);
    for i in 0..3 {
        assert!(
            out.stdout.contains(&format!("node{i}: fs1 unmounted")),
            "{out}"
        );
        assert!(!is_mounted(&c.mount(i)));
    }
    assert_eq!(disk_magic(&c, "d0"), b"MAKODISK");
    let out = ok(&c, &["fs", "delete", "fs1"]);
    assert!(out.stdout.contains("fs1 deleted"), "{out}");
    assert_ne!(disk_magic(&c, "d0"), b"MAKODISK");
    assert_ne!(disk_magic(&c, "d1"), b"MAKODISK");
    let text = fails(&c, &["fs", "mount", "fs1", "-N", "node0"]);
    assert!(text.contains("fs1"), "{text}");
    let show = ok(&c, &["node", "show"]).stdout;
    assert!(
        show.contains("File systems: none") && show.contains("Disks: d0, d1"),
        "{show}"
    );
    ok(&c, &["disk", "delete", "d0"]);
    let text = fails(&c, &["disk", "delete", "nosuch"]);
    assert!(
        text.contains("no disk nosuch") && text.contains("d1"),
        "{text}"
    );
    // Restarted, the nodes do not bring back what was deleted from their cluster.toml.
    ok(&c, &["shutdown", "-a"]);
    ok(&c, &["startup", "-a"]);
    let show = wait_active(&c, 3);
    assert!(
        show.contains("File systems: none") && show.contains("Disks: d1\n"),
        "{show}"
    );
    c.down().expect("down");
}

#[test]
fn cluster_create_makes_a_cluster_that_startup_starts_with_the_quorum_nodes_named() {
    if !require_fuse(
        "cluster_create_makes_a_cluster_that_startup_starts_with_the_quorum_nodes_named",
    ) {
        return;
    }
    let c = NetCluster::up(NetClusterOptions {
        disk_size: "1G".into(),
        create_args: Some(
            ["--name", "demo", "--quorum-nodes", "node0"]
                .into_iter()
                .map(String::from)
                .collect(),
        ),
        ..NetClusterOptions::default()
    })
    .expect("cluster create, startup -a");
    let show = wait_active(&c, 3);
    assert!(show.starts_with("Cluster demo,"), "{show}");
    assert!(node_line(&show, "node0").contains("quorum"), "{show}");
    for i in 1..3 {
        let line = node_line(&show, &format!("node{i}"));
        assert!(
            !line.contains("quorum") && line.contains("active (learner)"),
            "{show}"
        );
    }
    std::fs::write(c.mount(2).join("f"), b"from node 2").unwrap();
    assert_eq!(std::fs::read(c.mount(0).join("f")).unwrap(), b"from node 2");

    // Refusals: a second cluster in the same directory; a quorum node that will not
    // exist (and then nothing is created).
    let text = fails(&c, &["cluster", "create", "--nodes", "3"]);
    assert!(text.contains("exists already"), "{text}");
    let other = c.data_dir().with_file_name("other");
    let out = c
        .mako_in(
            &other,
            &[
                "cluster",
                "create",
                "--nodes",
                "3",
                "--quorum-nodes",
                "node7",
            ],
        )
        .unwrap();
    assert!(!out.success(), "{out}");
    assert!(
        out.stderr.contains("node7") && out.stderr.contains("node0 to node2"),
        "{out}"
    );
    assert!(!other.join("cluster.toml").exists());
    c.finish().expect("down and fsck clean");
}

/// Kills a makod this test started by hand, if it still runs when the test ends.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `mako node add|remove` (issue 13 item 5): a node added to a running cluster of two
/// starts from the directory the command made, mounts and reads a file node0 wrote;
/// its removal is refused while it runs, done once it is stopped; `mako node show`
/// follows each step; the removed node cannot join again, even with the key restored.
#[test]
fn a_node_added_to_a_running_cluster_mounts_and_a_removed_one_cannot_rejoin() {
    if !require_fuse("a_node_added_to_a_running_cluster_mounts_and_a_removed_one_cannot_rejoin") {
        return;
    }
    let mut c = NetCluster::up(NetClusterOptions {
        nodes: 2,
        disk_size: "1G".into(),
        create_args: Some(vec!["--max-nodes".into(), "3".into()]),
        ..NetClusterOptions::default()
    })
    .expect("two nodes up");
    wait_active(&c, 2);
    std::fs::write(c.mount(0).join("from-node0"), b"written on node0\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let address = format!("127.0.0.1:{port}");

    // Refusals change nothing.
    let out = c
        .mako(&[
            "node",
            "add",
            "nq",
            "--address",
            "127.0.0.1:1",
            "--roles",
            "quorum",
        ])
        .unwrap();
    assert!(
        !out.success() && out.stderr.contains("cannot be a quorum node"),
        "{out}"
    );
    let out = c
        .mako(&["node", "add", "node1", "--address", &address])
        .unwrap();
    assert!(
        !out.success() && out.stderr.contains("exists already"),
        "{out}"
    );
    assert!(!c.data_dir().join("nq").exists());

    ok(&c, &["node", "add", "node2", "--address", &address]);
    let show = ok(&c, &["node", "show"]).stdout;
    assert!(node_line(&show, "node2").contains("client"), "{show}");
    assert!(show.contains("2 of 3 nodes active"), "{show}");
    let status = ok(&c, &["status"]).stdout;
    assert!(status.contains("node2"), "{status}");

    ok(&c, &["startup", "-N", "node2"]);
    c.set_nodes(3);
    assert!(is_mounted(&c.mount(2)));
    assert_eq!(
        std::fs::read(c.mount(2).join("from-node0")).unwrap(),
        b"written on node0\n"
    );
    std::fs::write(c.mount(2).join("from-node2"), b"written on node2\n").unwrap();
    assert_eq!(
        std::fs::read(c.mount(0).join("from-node2")).unwrap(),
        b"written on node2\n"
    );
    let show = wait_for(&c, "node2 active as a learner", || {
        let out = c.mako(&["node", "show"]).map_err(|e| e.to_string())?;
        if out.success() && node_line(&out.stdout, "node2").contains("active (learner)") {
            Ok(out.stdout)
        } else {
            Err(format!("{out}"))
        }
    });
    assert!(show.contains("3 of 3 nodes active"), "{show}");

    // Refused while it runs (and for a quorum node), then done once it is stopped.
    let out = c.mako(&["node", "remove", "node2"]).unwrap();
    assert!(
        !out.success() && out.stderr.contains("mako shutdown -N node2"),
        "{out}"
    );
    let out = c.mako(&["node", "remove", "node0"]).unwrap();
    assert!(
        !out.success() && out.stderr.contains("nothing was removed"),
        "{out}"
    );
    ok(&c, &["shutdown", "-N", "node2"]);
    assert!(!is_mounted(&c.mount(2)));
    ok(&c, &["node", "remove", "node2"]);
    let show = ok(&c, &["node", "show"]).stdout;
    assert!(
        !show
            .lines()
            .any(|l| l.split_whitespace().next() == Some("node2")),
        "{show}"
    );
    assert!(show.contains("2 of 2 nodes active"), "{show}");
    let out = c.mako(&["startup", "-N", "node2"]).unwrap();
    assert!(
        !out.success() && out.stderr.contains("no such node"),
        "{out}"
    );

    // Each running node refuses the removed number once its applier took the epoch in.
    for i in 0..2 {
        wait_for(&c, &format!("node{i} to forget node2"), || {
            let log = std::fs::read_to_string(c.node_dir(i).join("makod.log"))
                .map_err(|e| e.to_string())?;
            if log.contains("node 2 is no longer in the cluster's configuration") {
                Ok(())
            } else {
                Err(c.log_tail(i, 10))
            }
        });
    }
    // With its key put back and started by hand, the others refuse its number.
    let dir = c.data_dir().join("node2");
    std::fs::copy(c.data_dir().join("cluster.key"), dir.join("cluster.key")).unwrap();
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("makod.log"))
        .unwrap();
    let mut child = ChildGuard(
        std::process::Command::new(c.makod_binary())
            .arg("--data-dir")
            .arg(&dir)
            .env("MAKO_MANAGER_WAIT_SECS", "120")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let code = wait_for(&c, "the removed node's makod to give up", || {
        match child.0.try_wait() {
            Ok(Some(code)) => Ok(code),
            Ok(None) => Err("still running".into()),
            Err(e) => panic!("{e}"),
        }
    });
    assert!(!code.success());
    let text = std::fs::read_to_string(dir.join("makod.log")).unwrap();
    assert!(text.contains("was removed from the cluster"), "{text}");
    assert!(!is_mounted(&c.mount(2)));
    assert_eq!(
        std::fs::read(c.mount(1).join("from-node2")).unwrap(),
        b"written on node2\n"
    );
    c.finish().unwrap();
}
