//! The quorum in one process: bootstrap, changes through followers and learners,
//! leader loss, quorum loss and return, validation, restart from the store, snapshots.

mod common;

use common::*;
use mako_cluster::{Command, ConfigError, Member, QuorumError, Role, Scope};
use mako_rt::NodeId;
use std::collections::BTreeSet;
use std::time::Duration;

#[test]
fn single_node_bootstrap_propose_and_restart_keep_the_config() {
    let mut c = Cluster::start(&[1], fast_options());
    // Before the bootstrap nothing can be proposed, and the error says why.
    let e = c.node(1).propose(create("c1")).unwrap_err();
    assert!(matches!(e, QuorumError::NotInitialized { .. }), "{e}");
    assert!(e.to_string().contains("mako cluster create"), "{e}");

    assert_eq!(c.bootstrap(&[1]), 1);
    let e = c
        .node(1)
        .bootstrap(&[(NodeId(1), member(1))].into())
        .unwrap_err();
    assert!(matches!(e, QuorumError::AlreadyInitialized { .. }), "{e}");

    assert_eq!(c.create(&[1]), 2);
    assert_eq!(
        c.node(1)
            .propose(Command::AddDisk(disk("d1", &[1])))
            .unwrap(),
        3
    );
    let set = Command::SetParam {
        name: "pagepool".into(),
        value: "2G".into(),
        scope: Scope::Cluster,
    };
    assert_eq!(c.node(1).propose(set).unwrap(), 4);
    let before = c.node(1).read_config().unwrap();
    assert_eq!(before.epoch, 4);
    assert_eq!(before.name, "c1");
    assert_eq!(before.params["pagepool"], "2G");
    assert_eq!(c.node(1).status().state, "leader");

    c.stop_node(1);
    assert!(c.data_dir(1).join("cluster.redb").exists());
    c.start_node(1);
    // The applied state is back before any election: read from the store.
    assert_eq!(c.node(1).read_local(), before);
    assert_eq!(c.leader(), 1);
    assert_eq!(c.node(1).read_config().unwrap(), before);
    assert_eq!(c.node(1).propose(fs("fs1", &["d1"])).unwrap(), 5);
    assert_eq!(c.node(1).read_config().unwrap().file_systems.len(), 1);
}

#[test]
fn a_follower_forwards_a_change_or_refuses_it_naming_the_leader() {
    let c = Cluster::start(&[1, 2, 3], fast_options());
    let leader = c.bootstrap(&[1, 2, 3]);
    let follower = c.follower(leader);
    let epoch = c.create(&[1, 2, 3]);
    // Forwarded: proposed on a follower, committed by the leader.
    let e2 = c
        .node(follower)
        .propose(Command::AddDisk(disk("d1", &[1, 2])))
        .unwrap();
    assert_eq!(e2, epoch + 1);
    // Refused: the follower names the cluster manager.
    let e = c
        .node(follower)
        .propose_here(Command::AddDisk(disk("d2", &[1])), PATIENCE)
        .unwrap_err();
    match &e {
        QuorumError::NotLeader {
            leader: Some(name), ..
        } => assert!(name.contains(&format!("node {leader} (n{leader})")), "{e}"),
        other => panic!("expected NotLeader, got {other:?}"),
    }
    assert!(e.to_string().contains("is not the cluster manager"), "{e}");
    let (manager, m) = c.node(follower).leader().unwrap();
    assert_eq!(
        (manager, m.name.as_str()),
        (NodeId(leader), name(leader).as_str())
    );
    // A linearizable read on a follower goes through the leader and sees the change.
    assert!(c
        .node(follower)
        .read_config()
        .unwrap()
        .disks
        .contains_key("d1"));
    // Every node applies the same configuration.
    let configs = c.converge(e2);
    assert!(configs.windows(2).all(|w| w[0] == w[1]), "{configs:?}");
}

#[test]
fn the_leader_stopped_a_new_one_is_elected_and_the_config_survives() {
    let mut c = Cluster::start(&[1, 2, 3], fast_options());
    let old = c.bootstrap(&[1, 2, 3]);
    let epoch = c.create(&[1, 2, 3]);
    let epoch = c
        .node(old)
        .propose(Command::AddDisk(disk("d1", &[1])))
        .unwrap()
        .max(epoch);
    c.converge(epoch);
    c.stop_node(old);
    let new = c.leader_other_than(Some(old));
    assert_ne!(new, old);
    let config = c.node(new).read_config().unwrap();
    assert_eq!(config.epoch, epoch);
    assert!(config.disks.contains_key("d1"));
    let survivor = c.follower(new);
    let epoch = c.node(survivor).propose(fs("fs1", &["d1"])).unwrap();
    // The old leader comes back as a follower and catches up from its store and the log.
    c.start_node(old);
    let configs = c.converge(epoch);
    assert!(configs
        .iter()
        .all(|cfg| cfg.file_systems.contains_key("fs1")));
}

fn quorum_lost_and_regained(stop_leader: bool) {
    let mut c = Cluster::start(&[1, 2, 3], fast_options());
    let leader = c.bootstrap(&[1, 2, 3]);
    let epoch = c.create(&[1, 2, 3]);
    c.converge(epoch);
    // Keep the leader (it must notice the quorum is gone) or a follower.
    let survivor = if stop_leader {
        c.follower(leader)
    } else {
        leader
    };
    let stopped: Vec<u32> = [1, 2, 3].into_iter().filter(|n| *n != survivor).collect();
    for n in &stopped {
        c.stop_node(*n);
    }
    let deadline = Duration::from_secs(20);
    let e = c
        .node(survivor)
        .propose_within(Command::AddDisk(disk("d1", &[survivor])), deadline)
        .unwrap_err();
    let text = e.to_string();
    match &e {
        QuorumError::QuorumLost {
            answering,
            silent,
            needed,
        } => {
            assert_eq!(*needed, 2, "{text}");
            assert_eq!(answering.len(), 1, "{text}");
            assert!(answering[0].contains(&name(survivor)), "{text}");
            assert_eq!(silent.len(), 2, "{text}");
            for n in &stopped {
                assert!(
                    text.contains(&format!("node {n} (n{n}) (not running)")),
                    "{text}"
                );
            }
        }
        other => panic!("expected QuorumLost, got {other:?}: {text}"),
    }
    assert!(
        text.starts_with("quorum lost: 1 of 3 quorum nodes answer"),
        "{text}"
    );
    // Reads need the quorum too.
    let e = c.node(survivor).read_config().unwrap_err();
    assert!(matches!(e, QuorumError::QuorumLost { .. }), "{e}");
    // The local view still works, and nothing was applied.
    assert_eq!(c.node(survivor).read_local().epoch, epoch);
    // `mako node show`: every node's own state, the stopped ones with why.
    let states = c.node(survivor).node_states();
    assert_eq!(states.len(), 3, "{states:?}");
    for (node, state) in states {
        if node.0 == survivor {
            assert_eq!(state.unwrap().epoch, epoch);
        } else {
            assert_eq!(state, Err("not running".to_string()));
        }
    }

    c.start_node(stopped[0]);
    let epoch2 = c
        .node(survivor)
        .propose(Command::AddDisk(disk("d1", &[survivor])))
        .unwrap();
    assert_eq!(epoch2, epoch + 1);
    assert!(c
        .node(stopped[0])
        .wait_epoch(epoch2, PATIENCE)
        .unwrap()
        .disks
        .contains_key("d1"));
}

#[test]
fn two_of_three_stopped_around_the_leader_quorum_lost_then_regained() {
    quorum_lost_and_regained(false);
}

#[test]
fn two_of_three_stopped_with_the_leader_quorum_lost_then_regained() {
    quorum_lost_and_regained(true);
}

/// A change forwarded to the cluster manager whose answer does not come within the
/// caller's deadline ends in a timeout whose outcome is unknown, never in
/// `QuorumLost` while every quorum node answers: the probe after the deadline gives
/// each node its whole probe deadline. (It was cut to what was left of the caller's
/// deadline, 1 ms at least, so a restarted client's rejoin, forwarded to a busy
/// manager, failed with "quorum lost: ... node 0 (no answer within 1ms)".)
#[test]
fn a_forward_that_times_out_does_not_call_the_quorum_lost() {
    let c = Cluster::start(&[1, 2, 3], fast_options());
    let leader = c.bootstrap(&[1, 2, 3]);
    let epoch = c.create(&[1, 2, 3]);
    c.converge(epoch);
    let follower = c.follower(leader);
    // Every call takes 20 ms, a forward 2 s more: one given 500 ms times out.
    *c.latency.every.lock() = Duration::from_millis(20);
    *c.latency.bulk.lock() = Duration::from_secs(2);
    let e = c
        .node(follower)
        .propose_within(
            Command::AddDisk(disk("d1", &[1])),
            Duration::from_millis(500),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            QuorumError::Timeout {
                outcome_unknown: true,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("cluster manager"), "{e}");
    // The forward was never delivered: with the latency gone the change commits next.
    *c.latency.bulk.lock() = Duration::ZERO;
    let next = c
        .node(follower)
        .propose(Command::AddDisk(disk("d1", &[1])))
        .unwrap();
    assert_eq!(next, epoch + 1);
}

#[test]
fn validation_errors_refuse_the_change_on_every_node() {
    let c = Cluster::start(&[1, 2, 3], fast_options());
    let leader = c.bootstrap(&[1, 2, 3]);
    let follower = c.follower(leader);
    c.create(&[1, 2, 3]);
    c.node(follower)
        .propose(Command::AddDisk(disk("d1", &[1])))
        .unwrap();
    let epoch = c.node(follower).propose(fs("fs1", &["d1"])).unwrap();

    // A disk in use: refused by the state machine, the epoch does not move.
    let e = c
        .node(follower)
        .propose(Command::DeleteDisk { name: "d1".into() })
        .unwrap_err();
    assert_eq!(
        e,
        QuorumError::Refused(ConfigError::DiskInUse {
            disk: "d1".into(),
            fs: "fs1".into()
        })
    );
    assert!(e.to_string().contains("in use by file system fs1"), "{e}");
    // A duplicate node name.
    let mut dup = node_entry(4, &[Role::Client]);
    dup.name = name(2);
    let e = c.node(leader).propose(Command::AddNode(dup)).unwrap_err();
    assert!(
        matches!(e, QuorumError::Refused(ConfigError::DuplicateNode { .. })),
        "{e}"
    );
    assert!(
        e.to_string().contains("name n2 is already taken by node 2"),
        "{e}"
    );
    // A bad address: refused before it reaches the log.
    let mut bad = node_entry(4, &[Role::Client]);
    bad.addresses = vec!["0.0.0.0:1191".parse().unwrap()];
    let e = c.node(follower).propose(Command::AddNode(bad)).unwrap_err();
    assert!(
        matches!(e, QuorumError::Refused(ConfigError::BadAddress { .. })),
        "{e}"
    );
    let e = mako_cluster::parse_address("n4", "n4.example.com").unwrap_err();
    assert!(e.to_string().contains("not IP:port"), "{e}");
    // A per-node value of a cluster-wide parameter, and an unknown node in -N.
    let e = c
        .node(follower)
        .propose(Command::SetParam {
            name: "pagepool".into(),
            value: "1G".into(),
            scope: Scope::Nodes(vec![NodeId(9)]),
        })
        .unwrap_err();
    assert_eq!(
        e,
        QuorumError::Refused(ConfigError::NoSuchNode { node: NodeId(9) })
    );

    // Nothing refused changed anything, anywhere.
    let configs = c.converge(epoch);
    for config in configs {
        assert_eq!(config.epoch, epoch);
        assert!(config.disks.contains_key("d1"));
        assert_eq!(config.nodes.len(), 3);
    }
    assert_eq!(c.node(leader).read_config().unwrap().epoch, epoch);
}

#[test]
fn learners_get_every_change_even_from_a_snapshot() {
    // Snapshots after 3 entries and no log kept behind them: a learner added later
    // can only catch up through a snapshot.
    let mut options = fast_options();
    options.snapshot_every = 3;
    options.keep_after_snapshot = 0;
    let mut c = Cluster::start(&[1, 2, 3], options);
    let leader = c.bootstrap(&[1, 2, 3]);
    c.create(&[1, 2, 3]);
    for i in 0..6 {
        c.node(leader)
            .propose(Command::AddDisk(disk(&format!("d{i}"), &[1])))
            .unwrap();
    }
    c.node(leader).trigger_snapshot().unwrap();
    let end = std::time::Instant::now() + PATIENCE;
    while c.node(leader).status().snapshot.is_none() {
        assert!(std::time::Instant::now() < end, "no snapshot built");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Node 4, a client node, joins as a learner.
    c.start_node(4);
    let e = c.node(4).propose(create("c2")).unwrap_err();
    assert!(matches!(e, QuorumError::NotInitialized { .. }), "{e}");
    let add = c
        .node(leader)
        .propose(Command::AddNode(node_entry(4, &[Role::Client])))
        .unwrap();
    let follower = c.follower(leader);
    let e = c
        .node(follower)
        .add_learner(NodeId(4), member(4), PATIENCE)
        .unwrap_err();
    assert!(matches!(e, QuorumError::NotLeader { .. }), "{e}");
    c.node(leader)
        .add_learner(NodeId(4), member(4), PATIENCE)
        .unwrap();
    let learned = c.node(4).wait_epoch(add, PATIENCE).unwrap();
    assert_eq!(learned, c.node(leader).read_config().unwrap());
    assert!(learned.disks.contains_key("d5"), "{learned:?}");
    let status = c.node(4).status();
    assert_eq!(status.state, "learner");
    assert_eq!(status.learners, vec![NodeId(4)]);
    assert!(
        status.snapshot.is_some(),
        "the learner installed a snapshot: {status:?}"
    );
    // A change proposed on the learner is forwarded to the cluster manager.
    let epoch = c
        .node(4)
        .propose(Command::SetParam {
            name: "pagepool".into(),
            value: "1G".into(),
            scope: Scope::Nodes(vec![NodeId(4)]),
        })
        .unwrap();
    assert!(epoch > add);
    let configs = c.converge(epoch);
    assert!(configs
        .iter()
        .all(|cfg| cfg.param_for(NodeId(4), "pagepool") == Some("1G")));
    // The learner restarts from its store (snapshot plus log) and keeps following.
    c.stop_node(4);
    c.start_node(4);
    assert_eq!(c.node(4).read_local().epoch, epoch);
    let epoch = c.node(leader).propose(fs("fs1", &["d0"])).unwrap();
    assert!(c
        .node(4)
        .wait_epoch(epoch, PATIENCE)
        .unwrap()
        .file_systems
        .contains_key("fs1"));
}

#[test]
fn the_quorum_grows_from_one_node_to_three() {
    let c = Cluster::start(&[1, 2, 3], fast_options());
    assert_eq!(c.bootstrap(&[1]), 1);
    c.create(&[1]);
    for n in [2, 3] {
        c.node(1)
            .propose(Command::AddNode(node_entry(n, &[Role::Quorum])))
            .unwrap();
        c.node(1)
            .add_learner(NodeId(n), member(n), PATIENCE)
            .unwrap();
    }
    // Node 4 is not started: it cannot become a voter before it is a learner.
    let e = c
        .node(1)
        .change_membership(&[1, 2, 4].map(NodeId).into(), PATIENCE)
        .unwrap_err();
    assert!(matches!(e, QuorumError::Membership { .. }), "{e}");
    // Two quorum nodes are refused: no safer than one, and slower.
    let e = c
        .node(1)
        .change_membership(&[1, 2].map(NodeId).into(), PATIENCE)
        .unwrap_err();
    assert!(e.to_string().contains("choose 1, 3 or 5"), "{e}");
    let quorum: BTreeSet<NodeId> = c.node(1).read_config().unwrap().quorum_nodes();
    assert_eq!(quorum, [1, 2, 3].map(NodeId).into());
    c.node(1).change_membership(&quorum, PATIENCE).unwrap();
    let status = c.node(1).status();
    assert_eq!(status.voters, vec![NodeId(1), NodeId(2), NodeId(3)]);
    assert!(status.learners.is_empty());
    // Every voter now takes part: a change proposed on node 3 commits.
    let epoch = c
        .node(3)
        .propose(Command::AddDisk(disk("d1", &[2, 3])))
        .unwrap();
    c.converge(epoch);
    assert_eq!(
        c.node(2).leader(),
        Some((
            NodeId(1),
            Member {
                name: name(1),
                address: address(1).to_string()
            }
        ))
    );
}

#[test]
fn a_node_whose_log_was_purged_restarts_from_its_applied_state() {
    // The log behind a snapshot is purged at once: after a restart the configuration
    // can come only from what the store kept, not from replaying the log.
    let mut options = fast_options();
    options.snapshot_every = 3;
    options.keep_after_snapshot = 0;
    let mut c = Cluster::start(&[1], options);
    c.bootstrap(&[1]);
    c.create(&[1]);
    for i in 0..6 {
        c.node(1)
            .propose(Command::AddDisk(disk(&format!("d{i}"), &[1])))
            .unwrap();
    }
    c.node(1).trigger_snapshot().unwrap();
    let end = std::time::Instant::now() + PATIENCE;
    while c.node(1).status().snapshot.is_none() {
        assert!(std::time::Instant::now() < end, "no snapshot built");
        std::thread::sleep(Duration::from_millis(20));
    }
    let epoch = c.node(1).propose(fs("fs1", &["d0"])).unwrap();
    let before = c.node(1).read_config().unwrap();
    assert_eq!(before.epoch, epoch);
    c.stop_node(1);
    c.start_node(1);
    assert_eq!(c.node(1).read_local(), before);
    assert_eq!(c.leader(), 1);
    assert_eq!(c.node(1).read_config().unwrap(), before);
    let epoch = c
        .node(1)
        .propose(Command::DeleteFs { name: "fs1".into() })
        .unwrap();
    assert_eq!(epoch, before.epoch + 1);
}
