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
    #[allow(dead_code)] // not every test file uses it
    pub fn new(n: u32, env: impl Fn(NodeEnv) -> NodeEnv) -> Nodes {
        Self::with_blocks(n, 64 << 10, env)
    }

    /// `new` with blocks of `block_bytes`.
    #[allow(dead_code)] // not every test file uses it
    pub fn with_blocks(n: u32, block_bytes: u32, env: impl Fn(NodeEnv) -> NodeEnv) -> Nodes {
        let disks = MemDisks::new(4, 64 << 20);
        disks.format(&MkfsParams {
            log_count: n,
            block_bytes,
            // The log holds at least 16 directory blocks.
            log_bytes: (16 * block_bytes as u64).max(1 << 20),
            // An indirect block is at least a subblock.
            indirect_bytes: (block_bytes / 128).max(4096),
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
            // As makod does (`MountedFs::write_back`): written back, then every token
            // given up, so the nodes still mounted find a metanode that is gone no
            // longer named (its service answers nothing once its core is dropped).
            let core = m.core().clone();
            m.unmount().expect("unmount");
            core.tokens.client().release_all().expect("release tokens");
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
