//! Nodes of one in-process cluster mounting one file system on memory disks, for the
//! integration tests of several nodes (`two_nodes.rs`, `resends.rs`).

use mako_fs::env::NodeEnv;
use mako_fs::fs::FileSystem;
use mako_fs::mount::{mount_node, Mounted};
use mako_fs::test_util::{small_config, small_params, MemDisks};
use mako_fs::{FsConfig, MkfsParams};

pub struct Nodes {
    pub disks: MemDisks,
    pub nodes: Vec<Mounted>,
}

impl Nodes {
    /// `n` nodes (a log each) on four 64 MiB disks, without background workers; each
    /// node's environment goes through `env` first (a test's transport wrapper).
    pub fn new(n: u32, env: impl Fn(NodeEnv) -> NodeEnv) -> Nodes {
        let disks = MemDisks::new(4, 64 << 20);
        disks.format(&MkfsParams {
            log_count: n,
            ..small_params()
        });
        let cfg = FsConfig {
            background_workers: false,
            ..small_config()
        };
        let nodes = NodeEnv::in_process_cluster(n)
            .into_iter()
            .map(|e| mount_node(disks.as_dyn(), cfg.clone(), env(e)).expect("mount"))
            .collect();
        Nodes { disks, nodes }
    }

    pub fn fs(&self, n: usize) -> &FileSystem {
        &self.nodes[n].fs
    }

    /// Unmounts every node; the file system must then check clean.
    pub fn finish(self) {
        for m in self.nodes {
            m.unmount().expect("unmount");
        }
        let r = mako_fsck::check_offline(
            self.disks.as_dyn(),
            &mako_fsck::Options::check(),
            &mako_fsck::NoProgress,
        )
        .expect("fsck runs");
        assert!(r.is_clean(), "{}", r.render());
    }
}
