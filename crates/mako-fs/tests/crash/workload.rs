//! The seeded workload of the crash test: operations on model inodes, a generator
//! that draws only operations the model says succeed (so a seed alone fixes the whole
//! run), and an executor that applies them to a mounted `FileSystem`.

use super::model::{Body, FileData, Kind, Mid, Model, CHUNK_BYTES, ROOT};
use mako_fs::fs::{Ctx, SetAttr};
use mako_fs::{FsError, Mounted};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::Arc;

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

/// Limits of the generated workload, named with their unit.
/// Files grow up to this size (past 64 direct blocks of 64 KiB: indirect blocks).
pub const FILE_BYTES_MAX: u64 = 7 << 20;
/// Dirty bytes the workload lets accumulate before it syncs (the pagepool must never
/// fill: without write-behind a full pagepool would stall a writer for 30 s).
pub const DIRTY_BYTES_MAX: u64 = 12 << 20;
/// Model inodes alive at most; past this the generator prefers removals.
pub const NODES_MAX: usize = 90;

/// One file system operation, on model inodes (`new` is the model inode a creation
/// makes).
#[derive(Debug, Clone)]
pub enum Op {
    Create {
        parent: Mid,
        name: Vec<u8>,
        perm: u32,
        new: Mid,
    },
    Mkdir {
        parent: Mid,
        name: Vec<u8>,
        perm: u32,
        new: Mid,
    },
    Symlink {
        parent: Mid,
        name: Vec<u8>,
        target: Vec<u8>,
        new: Mid,
    },
    Write {
        file: Mid,
        offset: u64,
        len: u32,
        seed: u64,
    },
    Truncate {
        file: Mid,
        size: u64,
    },
    Rename {
        src_parent: Mid,
        src_name: Vec<u8>,
        dst_parent: Mid,
        dst_name: Vec<u8>,
    },
    Unlink {
        parent: Mid,
        name: Vec<u8>,
    },
    Rmdir {
        parent: Mid,
        name: Vec<u8>,
    },
    Link {
        file: Mid,
        parent: Mid,
        name: Vec<u8>,
    },
    SetXattr {
        node: Mid,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    RemoveXattr {
        node: Mid,
        name: Vec<u8>,
    },
    Chmod {
        node: Mid,
        perm: u32,
    },
    Fsync {
        node: Mid,
    },
    Sync,
    Unmount,
}

impl Op {
    /// Does the op return only after making things durable (fsync, sync, unmount)?
    pub fn is_durability_point(&self) -> bool {
        matches!(self, Op::Fsync { .. } | Op::Sync | Op::Unmount)
    }

    /// The file whose content the op changes, if any.
    pub fn content_change(&self) -> Option<Mid> {
        match self {
            Op::Create { new, .. } => Some(*new),
            Op::Write { file, .. } | Op::Truncate { file, .. } => Some(*file),
            _ => None,
        }
    }

    /// A readable description, with paths as they are in `model` (the state before the op).
    pub fn describe(&self, model: &Model) -> String {
        let path_of = |dir: Mid, name: &[u8]| super::model::join(&model.dir_path(dir), name);
        let node_path = |m: Mid| -> String {
            if m == ROOT {
                return "/".into();
            }
            // Any name of the node.
            let mut stack = vec![ROOT];
            while let Some(d) = stack.pop() {
                for (n, &c) in model.children(d) {
                    if c == m {
                        return path_of(d, n);
                    }
                    if model.node(c).kind() == Kind::Dir {
                        stack.push(c);
                    }
                }
            }
            format!("<model inode {m}>")
        };
        let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match self {
            Op::Create {
                parent, name, perm, ..
            } => format!("create {} mode {perm:o}", path_of(*parent, name)),
            Op::Mkdir {
                parent, name, perm, ..
            } => format!("mkdir {} mode {perm:o}", path_of(*parent, name)),
            Op::Symlink {
                parent,
                name,
                target,
                ..
            } => format!(
                "symlink {} -> {} bytes",
                path_of(*parent, name),
                target.len()
            ),
            Op::Write {
                file, offset, len, ..
            } => format!("write {} at {offset}+{len}", node_path(*file)),
            Op::Truncate { file, size } => format!("truncate {} to {size}", node_path(*file)),
            Op::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
            } => {
                format!(
                    "rename {} -> {}",
                    path_of(*src_parent, src_name),
                    path_of(*dst_parent, dst_name)
                )
            }
            Op::Unlink { parent, name } => format!("unlink {}", path_of(*parent, name)),
            Op::Rmdir { parent, name } => format!("rmdir {}", path_of(*parent, name)),
            Op::Link { file, parent, name } => {
                format!("link {} as {}", node_path(*file), path_of(*parent, name))
            }
            Op::SetXattr { node, name, value } => format!(
                "setxattr {} {} ({} bytes)",
                node_path(*node),
                s(name),
                value.len()
            ),
            Op::RemoveXattr { node, name } => {
                format!("removexattr {} {}", node_path(*node), s(name))
            }
            Op::Chmod { node, perm } => format!("chmod {} {perm:o}", node_path(*node)),
            Op::Fsync { node } => format!("fsync {}", node_path(*node)),
            Op::Sync => "sync".into(),
            Op::Unmount => "unmount".into(),
        }
    }

    /// Apply the op to the model (the generator drew it as valid there).
    pub fn apply_to_model(&self, m: &mut Model) {
        match self {
            Op::Create {
                parent,
                name,
                perm,
                new,
            } => {
                let got = m.create(*parent, name, *perm, Body::File(FileData::default()));
                assert_eq!(got, *new, "model inode numbering diverged");
            }
            Op::Mkdir {
                parent,
                name,
                perm,
                new,
            } => {
                let got = m.create(*parent, name, *perm, Body::Dir(Default::default()));
                assert_eq!(got, *new, "model inode numbering diverged");
            }
            Op::Symlink {
                parent,
                name,
                target,
                new,
            } => {
                let got = m.create(*parent, name, 0o777, Body::Symlink(target.clone()));
                assert_eq!(got, *new, "model inode numbering diverged");
            }
            Op::Write {
                file,
                offset,
                len,
                seed,
            } => m.write(*file, *offset, &pattern(*seed, *len as usize)),
            Op::Truncate { file, size } => m.truncate(*file, *size),
            Op::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
            } => m.rename(*src_parent, src_name, *dst_parent, dst_name),
            Op::Unlink { parent, name } | Op::Rmdir { parent, name } => m.remove(*parent, name),
            Op::Link { file, parent, name } => m.link(*file, *parent, name),
            Op::SetXattr { node, name, value } => m.set_xattr(*node, name, value),
            Op::RemoveXattr { node, name } => m.remove_xattr(*node, name),
            Op::Chmod { node, perm } => m.chmod(*node, *perm),
            Op::Fsync { .. } | Op::Sync | Op::Unmount => {}
        }
    }
}

/// Deterministic bytes for a write (no zero byte, so a lost write shows).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    mako_fs::test_util::pattern(seed, len)
        .into_iter()
        .map(|b| b | 1)
        .collect()
}

/// A seed's whole run: the operations and the model state after each (state `i` is
/// the state after the first `i` operations; state 0 is the empty file system).
pub struct Plan {
    pub seed: u64,
    pub ops: Vec<Op>,
    pub models: Vec<Arc<Model>>,
    pub canons: Vec<Arc<super::model::Canon>>,
}

impl Plan {
    /// Draw `ops` operations (the last one an unmount) from `seed`.
    pub fn generate(seed: u64, ops: usize) -> Plan {
        let mut g = Generator {
            rng: StdRng::seed_from_u64(seed),
            model: Model::new(),
            dirty_bytes: 0,
            burst: None,
            long_names: 0,
            recent: Vec::new(),
        };
        let mut plan = Plan::from_ops(seed, Vec::new());
        for i in 0..ops {
            let op = if i + 1 == ops {
                Op::Unmount
            } else {
                g.next_op()
            };
            op.apply_to_model(&mut g.model);
            plan.push(op);
        }
        plan
    }

    /// A plan of given operations (tests of the harness itself); they must be valid.
    pub fn from_ops(seed: u64, ops: Vec<Op>) -> Plan {
        let model = Model::new();
        let mut plan = Plan {
            seed,
            ops: Vec::new(),
            models: vec![Arc::new(model.clone())],
            canons: vec![Arc::new(model.canon())],
        };
        for op in ops {
            plan.push(op);
        }
        plan
    }

    fn push(&mut self, op: Op) {
        let mut model = (**self.models.last().expect("state 0")).clone();
        op.apply_to_model(&mut model);
        self.ops.push(op);
        self.canons.push(Arc::new(model.canon()));
        self.models.push(Arc::new(model));
    }
}

struct Generator {
    rng: StdRng,
    model: Model,
    dirty_bytes: u64,
    /// Creating many entries in one directory (to push it out of the inode and split
    /// its blocks): the directory and how many are left.
    burst: Option<(Mid, u32)>,
    long_names: u64,
    /// Files created or written lately: writes and fsyncs prefer them, as programs
    /// write a file and then fsync it.
    recent: Vec<Mid>,
}

/// The tail of long names (directories fill their inode and fragments sooner);
/// reports print it as `…`.
pub const LONG_NAME_FILLER: &str = "-with-a-name-long-enough-to-fill-directory-blocks";

/// A report with the long-name filler abbreviated.
pub fn abbreviate(s: &str) -> String {
    s.replace(LONG_NAME_FILLER, "…")
}

const SHORT_NAMES: [&str; 10] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
const XATTR_NAMES: [&str; 4] = [
    "user.a",
    "user.b",
    "user.color",
    "user.a-rather-long-attribute-name",
];
const PERMS: [u32; 5] = [0o644, 0o600, 0o755, 0o640, 0o700];

impl Generator {
    fn short_name(&mut self) -> Vec<u8> {
        SHORT_NAMES[self.rng.gen_range(0..SHORT_NAMES.len())]
            .as_bytes()
            .to_vec()
    }

    fn long_name(&mut self) -> Vec<u8> {
        self.long_names += 1;
        format!("entry-{:05}{LONG_NAME_FILLER}", self.long_names).into_bytes()
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> Option<T> {
        (!v.is_empty()).then(|| v[self.rng.gen_range(0..v.len())])
    }

    /// A file: a recent one more often than not.
    fn pick_file(&mut self, files: &[Mid]) -> Option<Mid> {
        self.recent.retain(|m| files.contains(m));
        if !self.recent.is_empty() && self.rng.gen_bool(0.6) {
            let r = self.recent.clone();
            return self.pick(&r);
        }
        self.pick(files)
    }

    fn touch(&mut self, m: Mid) {
        self.recent.retain(|&x| x != m);
        self.recent.push(m);
        if self.recent.len() > 4 {
            self.recent.remove(0);
        }
    }

    /// Every (directory, name) pair whose entry satisfies `f`.
    fn entries(&self, f: impl Fn(&Model, Mid) -> bool) -> Vec<(Mid, Vec<u8>)> {
        let mut out = Vec::new();
        for d in self.model.ids_of(Kind::Dir) {
            for (n, &c) in self.model.children(d) {
                if f(&self.model, c) {
                    out.push((d, n.clone()));
                }
            }
        }
        out
    }

    fn free_name_in(&mut self, dir: Mid) -> Option<Vec<u8>> {
        for _ in 0..8 {
            let n = if self.rng.gen_bool(0.85) {
                self.short_name()
            } else {
                self.long_name()
            };
            if self.model.lookup(dir, &n).is_none() {
                return Some(n);
            }
        }
        None
    }

    fn next_op(&mut self) -> Op {
        if self.dirty_bytes > DIRTY_BYTES_MAX {
            self.dirty_bytes = 0;
            return Op::Sync;
        }
        if let Some((dir, left)) = self.burst {
            if left > 0
                && self.model.nodes.contains_key(&dir)
                && self.model.nodes.len() < NODES_MAX + 60
            {
                self.burst = Some((dir, left - 1));
                let name = self.long_name();
                let new = self.model.next_mid;
                return Op::Create {
                    parent: dir,
                    name,
                    perm: 0o644,
                    new,
                };
            }
            self.burst = None;
        }
        loop {
            if let Some(op) = self.try_op() {
                match &op {
                    Op::Write { len, file, .. } => {
                        self.dirty_bytes += (*len as u64).next_multiple_of(CHUNK_BYTES);
                        self.touch(*file);
                    }
                    Op::Create { new, .. } => self.touch(*new),
                    Op::Sync => self.dirty_bytes = 0,
                    _ => {}
                }
                return op;
            }
        }
    }

    /// One attempt at drawing an operation; `None` when the drawn kind does not fit
    /// the current state.
    fn try_op(&mut self) -> Option<Op> {
        let crowded = self.model.nodes.len() >= NODES_MAX;
        let dirs = self.model.ids_of(Kind::Dir);
        let files = self.model.ids_of(Kind::File);
        let r = self.rng.gen_range(0..100);
        match r {
            0..=13 if !crowded => {
                let parent = self.pick(&dirs)?;
                let name = self.free_name_in(parent)?;
                Some(Op::Create {
                    parent,
                    name,
                    perm: PERMS[self.rng.gen_range(0..PERMS.len())],
                    new: self.model.next_mid,
                })
            }
            14..=18 if !crowded => {
                let parent = self.pick(&dirs)?;
                let name = self.free_name_in(parent)?;
                Some(Op::Mkdir {
                    parent,
                    name,
                    perm: [0o755, 0o700, 0o750][self.rng.gen_range(0..3)],
                    new: self.model.next_mid,
                })
            }
            19..=20 if !crowded => {
                let parent = self.pick(&dirs)?;
                let name = self.free_name_in(parent)?;
                // Long targets: some no longer fit in the inode (a data block).
                let len = if self.rng.gen_bool(0.3) {
                    self.rng.gen_range(3500..=4095)
                } else {
                    self.rng.gen_range(1..120)
                };
                let target: Vec<u8> = (0..len)
                    .map(|i| b"abcdefghijklmnopqrstuvwxyz/._-"[(i * 7 + len) % 30])
                    .collect();
                Some(Op::Symlink {
                    parent,
                    name,
                    target,
                    new: self.model.next_mid,
                })
            }
            21 if !crowded => {
                // A burst of creates in one directory: inline -> blocks -> hashed.
                let dir = self.pick(&dirs)?;
                self.burst = Some((dir, self.rng.gen_range(20..80)));
                None
            }
            22..=45 => {
                let file = self.pick_file(&files)?;
                let size = self.model.file(file).size;
                Some(self.write_op(file, size))
            }
            46..=50 => {
                let file = self.pick_file(&files)?;
                let size = self.model.file(file).size;
                let new = match self.rng.gen_range(0..6) {
                    0 => 0,
                    1 => self.rng.gen_range(0..3000),
                    2 => size / 2,
                    3 => size.saturating_sub(self.rng.gen_range(1..5000)),
                    4 => (size + self.rng.gen_range(1..100_000)).min(FILE_BYTES_MAX),
                    _ => self.rng.gen_range(0..FILE_BYTES_MAX),
                };
                Some(Op::Truncate { file, size: new })
            }
            51..=59 => self.rename_op(),
            60..=64 => {
                let (parent, name) = self.pick_entry(|m, c| m.node(c).kind() != Kind::Dir)?;
                Some(Op::Unlink { parent, name })
            }
            65..=67 => {
                let (parent, name) = self
                    .pick_entry(|m, c| matches!(&m.node(c).body, Body::Dir(ch) if ch.is_empty()))?;
                Some(Op::Rmdir { parent, name })
            }
            68..=70 => {
                let file = self.pick(&files)?;
                let parent = self.pick(&dirs)?;
                let name = self.free_name_in(parent)?;
                Some(Op::Link { file, parent, name })
            }
            71..=76 => {
                let node = self.pick_xattr_node()?;
                let name = XATTR_NAMES[self.rng.gen_range(0..XATTR_NAMES.len())]
                    .as_bytes()
                    .to_vec();
                // One in four is large: attributes in xattr blocks (four names of up
                // to 60,000 bytes stay under the 256 KiB per file), replaced in place,
                // shrunk back into the inode, removed.
                let len = if self.rng.gen_range(0..4) == 0 {
                    self.rng.gen_range(4000..60_000)
                } else {
                    self.rng.gen_range(0..200)
                };
                let value = pattern(self.rng.gen(), len);
                Some(Op::SetXattr { node, name, value })
            }
            77..=78 => {
                let node = self.pick_xattr_node()?;
                let names: Vec<Vec<u8>> = self.model.node(node).xattrs.keys().cloned().collect();
                let name = names
                    .get(self.rng.gen_range(0..names.len().max(1)))?
                    .clone();
                Some(Op::RemoveXattr { node, name })
            }
            79..=80 => {
                let node = self.pick_xattr_node()?;
                Some(Op::Chmod {
                    node,
                    perm: PERMS[self.rng.gen_range(0..PERMS.len())],
                })
            }
            81..=89 => Some(Op::Fsync {
                node: self.pick_file(&files)?,
            }),
            90..=92 => Some(Op::Fsync {
                node: self.pick(&dirs)?,
            }),
            93 => {
                let links = self.model.ids_of(Kind::Symlink);
                Some(Op::Fsync {
                    node: self.pick(&links)?,
                })
            }
            94..=96 => Some(Op::Sync),
            _ if crowded => {
                // Make room: remove a file or an empty directory.
                let (parent, name) = self.pick_entry(|m, c| m.node(c).kind() != Kind::Dir)?;
                Some(Op::Unlink { parent, name })
            }
            _ => None,
        }
    }

    fn pick_entry(&mut self, f: impl Fn(&Model, Mid) -> bool) -> Option<(Mid, Vec<u8>)> {
        let e = self.entries(f);
        (!e.is_empty()).then(|| e[self.rng.gen_range(0..e.len())].clone())
    }

    /// user.* attributes and chmod: files and directories (the root included).
    fn pick_xattr_node(&mut self) -> Option<Mid> {
        let v: Vec<Mid> = self
            .model
            .nodes
            .iter()
            .filter(|(_, n)| n.kind() != Kind::Symlink)
            .map(|(&m, _)| m)
            .collect();
        self.pick(&v)
    }

    fn write_op(&mut self, file: Mid, size: u64) -> Op {
        let bb = 64u64 << 10;
        let (offset, len) = match self.rng.gen_range(0..8) {
            // Small, near the start: stays in the inode while the file is small.
            0 => (self.rng.gen_range(0..2000), self.rng.gen_range(1..1500)),
            // A fragment (partial last block).
            1 => (self.rng.gen_range(0..60_000), self.rng.gen_range(1..20_000)),
            // Whole blocks.
            2 => (self.rng.gen_range(0..5) * bb, bb * self.rng.gen_range(1..3)),
            // Append.
            3 => (size, self.rng.gen_range(1..70_000)),
            // Overwrite inside the file.
            4 if size > 0 => {
                let o = self.rng.gen_range(0..size);
                (o, self.rng.gen_range(1..=(size - o).clamp(1, 30_000)))
            }
            // Far out: a sparse file that needs indirect blocks (past 64 x 64 KiB).
            5 | 6 => (
                self.rng
                    .gen_range((4u64 << 20) + 300_000..(6u64 << 20) + 500_000),
                self.rng.gen_range(1..9000),
            ),
            // Across a block boundary.
            _ => (
                self.rng.gen_range(1..6) * bb - self.rng.gen_range(1..2000),
                self.rng.gen_range(1..5000),
            ),
        };
        let len = len.min(FILE_BYTES_MAX - offset.min(FILE_BYTES_MAX)).max(1);
        let offset = offset.min(FILE_BYTES_MAX - len);
        Op::Write {
            file,
            offset,
            len: len as u32,
            seed: self.rng.gen(),
        }
    }

    fn rename_op(&mut self) -> Option<Op> {
        let (src_parent, src_name) = self.pick_entry(|_, _| true)?;
        let src = self.model.lookup(src_parent, &src_name)?;
        let src_kind = self.model.node(src).kind();
        let dirs = self.model.ids_of(Kind::Dir);
        // Same directory half of the time.
        let dst_parent = if self.rng.gen_bool(0.5) {
            src_parent
        } else {
            self.pick(&dirs)?
        };
        if src_kind == Kind::Dir && self.model.is_ancestor_or_self(src, dst_parent) {
            return None; // into itself: EINVAL
        }
        // An existing name (replace) a third of the time.
        let existing: Vec<Vec<u8>> = self.model.children(dst_parent).keys().cloned().collect();
        let dst_name = if self.rng.gen_bool(0.35) && !existing.is_empty() {
            existing[self.rng.gen_range(0..existing.len())].clone()
        } else {
            self.short_name()
        };
        if let Some(dst) = self.model.lookup(dst_parent, &dst_name) {
            if dst != src {
                let dk = self.model.node(dst).kind();
                let ok = match (src_kind, dk) {
                    (Kind::Dir, Kind::Dir) => self.model.children(dst).is_empty(),
                    (Kind::Dir, _) | (_, Kind::Dir) => false,
                    _ => true,
                };
                if !ok {
                    return None;
                }
            }
        }
        Some(Op::Rename {
            src_parent,
            src_name,
            dst_parent,
            dst_name,
        })
    }
}

/// Applies operations to a mounted file system, translating model inodes to inode numbers.
pub struct Executor {
    pub mounted: Option<Mounted>,
    pub inos: HashMap<Mid, u64>,
}

impl Executor {
    pub fn new(mounted: Mounted) -> Executor {
        Executor {
            mounted: Some(mounted),
            inos: HashMap::from([(ROOT, mako_fs::fs::ROOT_INO)]),
        }
    }

    fn ino(&self, m: Mid) -> u64 {
        *self
            .inos
            .get(&m)
            .unwrap_or_else(|| panic!("harness: model inode {m} has no inode number"))
    }

    /// Run one op. `Err` carries the file system's error.
    pub fn apply(&mut self, op: &Op) -> Result<(), FsError> {
        if let Op::Unmount = op {
            let m = self
                .mounted
                .take()
                .expect("harness: unmount of an unmounted file system");
            return m.unmount();
        }
        let fs = &self.mounted.as_ref().expect("harness: op after unmount").fs;
        match op {
            Op::Create {
                parent,
                name,
                perm,
                new,
            } => {
                let a = fs.create(CTX, self.ino(*parent), name, *perm, 0, true)?;
                self.inos.insert(*new, a.ino);
            }
            Op::Mkdir {
                parent,
                name,
                perm,
                new,
            } => {
                let a = fs.mkdir(CTX, self.ino(*parent), name, *perm, 0)?;
                self.inos.insert(*new, a.ino);
            }
            Op::Symlink {
                parent,
                name,
                target,
                new,
            } => {
                let a = fs.symlink(CTX, self.ino(*parent), name, target)?;
                self.inos.insert(*new, a.ino);
            }
            Op::Write {
                file,
                offset,
                len,
                seed,
            } => {
                let n = fs.write(
                    self.ino(*file),
                    *offset,
                    &pattern(*seed, *len as usize),
                    false,
                )?;
                if n != *len as usize {
                    return Err(FsError::Invalid(format!("short write: {n} of {len} bytes")));
                }
            }
            Op::Truncate { file, size } => {
                fs.setattr(
                    self.ino(*file),
                    SetAttr {
                        size: Some(*size),
                        ..Default::default()
                    },
                )?;
            }
            Op::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
            } => {
                fs.rename(
                    self.ino(*src_parent),
                    src_name,
                    self.ino(*dst_parent),
                    dst_name,
                    0,
                )?;
            }
            Op::Unlink { parent, name } => fs.unlink(self.ino(*parent), name)?,
            Op::Rmdir { parent, name } => fs.rmdir(self.ino(*parent), name)?,
            Op::Link { file, parent, name } => {
                fs.link(self.ino(*file), self.ino(*parent), name)?;
            }
            Op::SetXattr { node, name, value } => fs.setxattr(self.ino(*node), name, value, 0)?,
            Op::RemoveXattr { node, name } => fs.removexattr(self.ino(*node), name)?,
            Op::Chmod { node, perm } => {
                fs.setattr(
                    self.ino(*node),
                    SetAttr {
                        mode: Some(*perm),
                        ..Default::default()
                    },
                )?;
            }
            Op::Fsync { node } => fs.fsync(self.ino(*node), false)?,
            Op::Sync => fs.sync()?,
            Op::Unmount => unreachable!(),
        }
        Ok(())
    }
}
