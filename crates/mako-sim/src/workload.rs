//! The seeded workload: steps of operations on random nodes. Within a step the
//! operations run concurrently and are chosen to commute (`keys`: what each reads and
//! changes; two operations conflict when they touch one key and not both only read or
//! both only make commuting changes such as creating distinct names in one directory),
//! so the model can check each against the state before the step. Steps follow each
//! other in simulated time: a step starts when the last one has completed everywhere.

use crate::model::{Kind, MIno, Model, ROOT};
use crate::ops::{Op, Path, RENAME_EXCHANGE, RENAME_NOREPLACE};
use crate::rng::SimRng;
use mako_format::inode::Timestamp;

/// The size of one record of the shared-file steps (the figure: not a power
/// of two, so records straddle block boundaries).
pub const RECORD_BYTES: u64 = 47_008;
/// Records of the shared file.
pub const RECORDS: u64 = 48;
/// The shared file of the record steps and the directory of the create storms.
pub const SHARED_FILE: &[u8] = b"records";
pub const SHARED_DIR: &[u8] = b"spool";

/// Names used in directories: few, so operations collide.
const NAMES: &[&[u8]] = &[b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"i", b"j"];
const XATTRS: &[&[u8]] = &[b"user.x", b"user.y", b"user.z"];
/// Deepest directory the workload makes (root = 0).
const DEPTH_MAX: usize = 3;
/// File data the model may hold before writes stop extending files (the disks hold
/// several times this).
const DATA_BUDGET_BYTES: u64 = 12 << 20;
/// Largest offset a write extends a file to.
const OFFSET_MAX: u64 = 1 << 20;

/// How an operation touches a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Read,
    /// A change that commutes with other `Commute` changes of the key (a name added to
    /// a directory, a time set to now, a size grown to at least).
    Commute,
    Excl,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Key {
    /// One name in a directory.
    Name(MIno, Vec<u8>),
    /// The set of names of a directory.
    List(MIno),
    /// An inode's attributes (size, times, mode, link count).
    Attr(MIno),
    /// A byte range of a file's data.
    Data(MIno, u64, u64),
    Xattr(MIno, Vec<u8>),
    XattrList(MIno),
    /// The shape of the tree (a directory changing parents).
    Tree,
}

fn same(a: &Key, b: &Key) -> bool {
    match (a, b) {
        (Key::Data(i, a0, a1), Key::Data(j, b0, b1)) => i == j && a0 < b1 && b0 < a1,
        _ => a == b,
    }
}

fn conflict(a: &[(Key, Access)], b: &[(Key, Access)]) -> bool {
    a.iter().any(|(ka, xa)| {
        b.iter().any(|(kb, xb)| {
            same(ka, kb)
                && !(*xa == Access::Read && *xb == Access::Read)
                && !(*xa == Access::Commute && *xb == Access::Commute)
        })
    })
}

/// One operation of a step.
#[derive(Clone, Debug)]
pub struct Planned {
    pub node: u32,
    pub op: Op,
    /// Simulated time after the step's start before the operation starts.
    pub delay_micros: u64,
    /// A read-only operation that races one change of the step (see `observe`): it
    /// must see the state before that change or after it, nothing in between.
    pub observer: bool,
}

/// What kind of step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Random operations.
    Mixed,
    /// Many nodes write distinct records of one shared file.
    Records,
    /// Many nodes create distinct names in one directory.
    Creates,
}

pub struct Workload {
    rng: SimRng,
    nodes: u32,
    /// Most operations in a mixed step.
    ops_max: usize,
    next_seed: u64,
    next_create: u64,
}

impl Workload {
    pub fn new(seed: u64, nodes: u32) -> Workload {
        Workload {
            // Its own stream: the workload of a seed does not change with the
            // scheduler's decisions.
            rng: SimRng::new(seed ^ 0x5157_4f52_4b4c_4f41),
            nodes,
            ops_max: (2 * nodes as usize + 2).min(12),
            next_seed: 1,
            next_create: 0,
        }
    }

    fn node(&mut self) -> u32 {
        self.rng.below(self.nodes as u64) as u32
    }

    fn delay(&mut self) -> u64 {
        self.rng.below(300)
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        if v.is_empty() {
            None
        } else {
            Some(&v[self.rng.below(v.len() as u64) as usize])
        }
    }

    /// The operations that set up the shared file and directory (step 0).
    pub fn setup(&mut self) -> Vec<Planned> {
        let n0 = self.node();
        let n1 = self.node();
        vec![
            Planned {
                node: n0,
                op: Op::Create {
                    parent: vec![],
                    name: SHARED_FILE.to_vec(),
                    perm: 0o644,
                    exclusive: true,
                },
                delay_micros: 0,
                observer: false,
            },
            Planned {
                node: n1,
                op: Op::Mkdir {
                    parent: vec![],
                    name: SHARED_DIR.to_vec(),
                    perm: 0o755,
                },
                delay_micros: 0,
                observer: false,
            },
        ]
    }

    /// Choose the next step's kind.
    pub fn step_kind(&mut self) -> StepKind {
        match self.rng.below(20) {
            0 => StepKind::Records,
            1 => StepKind::Creates,
            _ => StepKind::Mixed,
        }
    }

    /// Plan one step against the model's current state.
    pub fn plan(&mut self, model: &Model, kind: StepKind) -> Vec<Planned> {
        match kind {
            StepKind::Records => self.plan_records(model),
            StepKind::Creates => self.plan_creates(model),
            StepKind::Mixed => self.plan_mixed(model),
        }
    }

    fn plan_records(&mut self, model: &Model) -> Vec<Planned> {
        if model.walk(&[SHARED_FILE.to_vec()]).is_err() {
            return self.plan_mixed(model);
        }
        let writers = (2 * self.nodes as u64).clamp(2, 16);
        let mut records: Vec<u64> = Vec::new();
        while (records.len() as u64) < writers {
            let r = self.rng.below(RECORDS);
            if !records.contains(&r) {
                records.push(r);
            }
        }
        records
            .into_iter()
            .map(|r| {
                let seed = self.data_seed();
                Planned {
                    node: self.node(),
                    op: Op::Write {
                        path: vec![SHARED_FILE.to_vec()],
                        offset: r * RECORD_BYTES,
                        len: RECORD_BYTES,
                        data_seed: seed,
                    },
                    delay_micros: self.delay(),
                    observer: false,
                }
            })
            .collect()
    }

    fn plan_creates(&mut self, model: &Model) -> Vec<Planned> {
        if model.walk(&[SHARED_DIR.to_vec()]).is_err() {
            return self.plan_mixed(model);
        }
        let creators = (2 * self.nodes as u64).clamp(2, 16);
        (0..creators)
            .map(|_| {
                self.next_create += 1;
                Planned {
                    node: self.node(),
                    op: Op::Create {
                        parent: vec![SHARED_DIR.to_vec()],
                        name: format!("c{}", self.next_create).into_bytes(),
                        perm: 0o644,
                        exclusive: true,
                    },
                    delay_micros: self.delay(),
                    observer: false,
                }
            })
            .collect()
    }

    fn plan_mixed(&mut self, model: &Model) -> Vec<Planned> {
        let want = 1 + self.rng.below(self.ops_max as u64) as usize;
        let mut chosen: Vec<(Planned, Vec<(Key, Access)>)> = Vec::new();
        let mut attempts = 0;
        while chosen.len() < want && attempts < want * 6 {
            attempts += 1;
            let op = self.gen_op(model);
            let k = keys(model, &op);
            if chosen.iter().any(|(_, c)| conflict(c, &k)) {
                continue;
            }
            let p = Planned {
                node: self.node(),
                op,
                delay_micros: self.delay(),
                observer: false,
            };
            chosen.push((p, k));
        }
        if self.rng.chance(0.5) {
            self.observe(model, &mut chosen);
        }
        chosen.into_iter().map(|(p, _)| p).collect()
    }

    /// Add up to two observers: read-only operations that each race exactly one
    /// change of the step (a stat of a name being renamed, a readdir of a directory
    /// gaining a name, a read of a range being written). An operation is atomic if
    /// every observer sees the whole change or none of it; the model checks the
    /// observer against the state before the step and after it.
    fn observe(&mut self, model: &Model, chosen: &mut Vec<(Planned, Vec<(Key, Access)>)>) {
        let mut added = 0;
        for _ in 0..6 {
            if added == 2 || chosen.is_empty() {
                return;
            }
            let target = self.rng.below(chosen.len() as u64) as usize;
            if chosen[target].0.observer || is_read_only(&chosen[target].0.op) {
                continue;
            }
            let Some(op) = self.observer_of(model, &chosen[target].0.op) else {
                continue;
            };
            let k = keys(model, &op);
            let hits: Vec<usize> = (0..chosen.len())
                .filter(|i| conflict(&chosen[*i].1, &k))
                .collect();
            if hits != [target] {
                continue;
            }
            let p = Planned {
                node: self.node(),
                op,
                delay_micros: self.delay(),
                observer: true,
            };
            chosen.push((p, k));
            added += 1;
        }
    }

    /// A read-only operation that looks at what `op` changes.
    fn observer_of(&mut self, m: &Model, op: &Op) -> Option<Op> {
        let join = |parent: &Path, name: &[u8]| {
            let mut p = parent.clone();
            p.push(name.to_vec());
            p
        };
        let parent_of = |path: &Path| path[..path.len().saturating_sub(1)].to_vec();
        let pick = self.rng.below(2) == 0;
        Some(match op {
            Op::Create { parent, name, .. }
            | Op::Mkdir { parent, name, .. }
            | Op::Symlink { parent, name, .. } => {
                if pick {
                    Op::Stat {
                        path: join(parent, name),
                    }
                } else {
                    Op::Readdir {
                        path: parent.clone(),
                    }
                }
            }
            Op::Link { path, parent, name } => match self.rng.below(3) {
                0 => Op::Stat { path: path.clone() },
                1 => Op::Stat {
                    path: join(parent, name),
                },
                _ => Op::Readdir {
                    path: parent.clone(),
                },
            },
            Op::Unlink { path } | Op::Rmdir { path } => {
                if pick {
                    Op::Stat { path: path.clone() }
                } else {
                    Op::Readdir {
                        path: parent_of(path),
                    }
                }
            }
            Op::Rename {
                path, parent, name, ..
            } => match self.rng.below(4) {
                0 => Op::Stat { path: path.clone() },
                1 => Op::Stat {
                    path: join(parent, name),
                },
                2 => Op::Readdir {
                    path: parent_of(path),
                },
                _ => Op::Readdir {
                    path: parent.clone(),
                },
            },
            Op::Write {
                path, offset, len, ..
            } => {
                if pick {
                    Op::Read {
                        path: path.clone(),
                        offset: offset.saturating_sub(self.rng.below(1000)),
                        len: len + self.rng.below(1000),
                    }
                } else {
                    Op::Stat { path: path.clone() }
                }
            }
            Op::Truncate { path, .. } => {
                let size = m.walk(path).map(|i| m.get(i).size()).unwrap_or(0);
                match self.rng.below(3) {
                    0 => Op::Stat { path: path.clone() },
                    1 => Op::Lseek {
                        path: path.clone(),
                        offset: self.rng.below(size + 1),
                        whence: libc::SEEK_HOLE,
                    },
                    _ => Op::Read {
                        path: path.clone(),
                        offset: self.rng.below(size + 1),
                        len: 1 + self.rng.below(200_000),
                    },
                }
            }
            Op::Chmod { path, .. } | Op::Utimes { path, .. } => Op::Stat { path: path.clone() },
            Op::SetXattr { path, name, .. } | Op::RemoveXattr { path, name } => {
                if pick {
                    Op::GetXattr {
                        path: path.clone(),
                        name: name.clone(),
                    }
                } else {
                    Op::ListXattr { path: path.clone() }
                }
            }
            _ => return None,
        })
    }

    fn data_seed(&mut self) -> u64 {
        self.next_seed += 1;
        self.next_seed
    }

    fn name(&mut self) -> Vec<u8> {
        self.pick(NAMES).expect("names").to_vec()
    }

    /// Generate one operation from the model's state.
    fn gen_op(&mut self, m: &Model) -> Op {
        let all = m.all_paths();
        let dirs: Vec<&(Path, MIno)> = all
            .iter()
            .filter(|(p, i)| m.get(*i).kind == Kind::Dir && p.len() < DEPTH_MAX)
            .collect();
        let below_root: Vec<&(Path, MIno)> = all.iter().filter(|(p, _)| !p.is_empty()).collect();
        let files: Vec<&(Path, MIno)> = all
            .iter()
            .filter(|(_, i)| m.get(*i).kind == Kind::File)
            .collect();
        let any: Vec<&(Path, MIno)> = all.iter().collect();
        // A path that may not exist: a random name in a random directory.
        let new_path = |w: &mut Workload| {
            let (d, _) = (*w.pick(&dirs).expect("the root is a directory")).clone();
            let mut p = d;
            p.push(w.name());
            p
        };
        let existing = |w: &mut Workload, set: &[&(Path, MIno)]| -> Path {
            if w.rng.chance(0.08) || set.is_empty() {
                new_path(w)
            } else {
                w.pick(set).expect("non-empty").0.clone()
            }
        };
        let budget_left = m.data_bytes() < DATA_BUDGET_BYTES;
        let r = self.rng.below(100);
        match r {
            0..=9 => {
                let mut p = new_path(self);
                let name = p.pop().expect("name");
                Op::Create {
                    parent: p,
                    name,
                    perm: [0o644, 0o600, 0o755][self.rng.below(3) as usize],
                    exclusive: !self.rng.chance(0.2),
                }
            }
            10..=13 => {
                let mut p = new_path(self);
                let name = p.pop().expect("name");
                Op::Mkdir {
                    parent: p,
                    name,
                    perm: 0o755,
                }
            }
            14..=15 => {
                let mut p = new_path(self);
                let name = p.pop().expect("name");
                let len = if self.rng.chance(0.2) {
                    200 + self.rng.below(3000)
                } else {
                    1 + self.rng.below(40)
                };
                let target: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                Op::Symlink {
                    parent: p,
                    name,
                    target,
                }
            }
            16..=17 => {
                let path = existing(self, &files);
                let mut p = new_path(self);
                let name = p.pop().expect("name");
                Op::Link {
                    path,
                    parent: p,
                    name,
                }
            }
            18..=22 => Op::Unlink {
                path: existing(self, &below_root),
            },
            23..=24 => Op::Rmdir {
                path: existing(self, &below_root),
            },
            25..=30 => {
                let path = existing(self, &below_root);
                let mut p = new_path(self);
                let name = p.pop().expect("name");
                let flags = match self.rng.below(10) {
                    0 => RENAME_NOREPLACE,
                    1 => RENAME_EXCHANGE,
                    _ => 0,
                };
                Op::Rename {
                    path,
                    parent: p,
                    name,
                    flags,
                }
            }
            31 => Op::Readlink {
                path: existing(self, &below_root),
            },
            32..=46 => {
                let path = existing(self, &files);
                let size = m.walk(&path).map(|i| m.get(i).size()).unwrap_or(0);
                let len = match self.rng.below(20) {
                    0..=5 => 1 + self.rng.below(64),
                    6..=13 => 1 + self.rng.below(8192),
                    14..=18 => 8192 + self.rng.below(150_000),
                    _ => RECORD_BYTES,
                };
                let offset = match self.rng.below(10) {
                    0..=3 => self.rng.below(size + 1),
                    4..=6 => size,
                    7..=8 => self.rng.below(256 << 10),
                    _ => self.rng.below(OFFSET_MAX),
                };
                let (offset, len) = if budget_left || offset + len <= size {
                    (offset, len)
                } else {
                    // Out of budget: overwrite inside the file only.
                    let o = self.rng.below(size.max(1));
                    (o, len.min(size.saturating_sub(o)).max(1))
                };
                Op::Write {
                    path,
                    offset,
                    len,
                    data_seed: self.data_seed(),
                }
            }
            47..=58 => {
                let path = existing(self, &files);
                let size = m.walk(&path).map(|i| m.get(i).size()).unwrap_or(0);
                Op::Read {
                    path,
                    offset: self.rng.below(size + 20_000),
                    len: 1 + self.rng.below(100_000),
                }
            }
            59..=62 => {
                let path = existing(self, &files);
                let size = m.walk(&path).map(|i| m.get(i).size()).unwrap_or(0);
                let to = match self.rng.below(4) {
                    0 => 0,
                    1 => size / 2,
                    2 if budget_left => size + self.rng.below(200_000),
                    _ => self.rng.below(size + 1),
                };
                Op::Truncate { path, size: to }
            }
            63..=64 => Op::Chmod {
                path: existing(self, &files),
                perm: [0o600, 0o640, 0o644, 0o755, 0o700][self.rng.below(5) as usize],
            },
            65..=66 => {
                let base = crate::clock::SIM_EPOCH.as_secs() as i64;
                let t = |w: &mut Workload| Timestamp {
                    sec: base - w.rng.below(86_400 * 365) as i64,
                    nsec: w.rng.below(1_000_000_000) as u32,
                };
                Op::Utimes {
                    path: existing(self, &any),
                    atime: t(self),
                    mtime: t(self),
                }
            }
            67..=69 => {
                let name = self.pick(XATTRS).expect("xattrs").to_vec();
                let len = 1 + self.rng.below(200) as usize;
                let seed = self.data_seed();
                Op::SetXattr {
                    path: existing(self, &any),
                    name,
                    value: crate::ops::pattern(seed, len),
                    flags: match self.rng.below(6) {
                        0 => libc::XATTR_CREATE,
                        1 => libc::XATTR_REPLACE,
                        _ => 0,
                    },
                }
            }
            70..=71 => Op::GetXattr {
                path: existing(self, &any),
                name: self.pick(XATTRS).expect("xattrs").to_vec(),
            },
            72 => Op::ListXattr {
                path: existing(self, &any),
            },
            73..=74 => Op::RemoveXattr {
                path: existing(self, &any),
                name: self.pick(XATTRS).expect("xattrs").to_vec(),
            },
            75..=77 => Op::Fsync {
                path: existing(self, &any),
            },
            78..=82 => {
                let dirs_all: Vec<&(Path, MIno)> = all
                    .iter()
                    .filter(|(_, i)| m.get(*i).kind == Kind::Dir)
                    .collect();
                Op::Readdir {
                    path: existing(self, &dirs_all),
                }
            }
            83..=94 => Op::Stat {
                path: existing(self, &any),
            },
            _ => {
                let path = existing(self, &files);
                let size = m.walk(&path).map(|i| m.get(i).size()).unwrap_or(0);
                Op::Lseek {
                    path,
                    offset: self.rng.below(size + 1000),
                    whence: if self.rng.chance(0.5) {
                        libc::SEEK_DATA
                    } else {
                        libc::SEEK_HOLE
                    },
                }
            }
        }
    }
}

/// True for operations that change nothing a user can see.
pub fn is_read_only(op: &Op) -> bool {
    matches!(
        op,
        Op::Stat { .. }
            | Op::Readdir { .. }
            | Op::Read { .. }
            | Op::Readlink { .. }
            | Op::GetXattr { .. }
            | Op::ListXattr { .. }
            | Op::Lseek { .. }
            | Op::Fsync { .. }
    )
}

/// The keys `path`'s lookups read; the inode it names, if it exists.
fn walk_keys(m: &Model, path: &[Vec<u8>], out: &mut Vec<(Key, Access)>) -> Option<MIno> {
    let mut cur = ROOT;
    for c in path {
        out.push((Key::Name(cur, c.clone()), Access::Read));
        let i = m.get(cur);
        if i.kind != Kind::Dir {
            return None;
        }
        cur = *i.entries.get(c)?;
    }
    Some(cur)
}

/// What `op` reads and changes, judged on the model's state before the step.
fn keys(m: &Model, op: &Op) -> Vec<(Key, Access)> {
    use Access::*;
    let mut k = Vec::new();
    // A name added to or removed from a directory: the name itself, and commuting
    // changes of the directory's list and attributes (times, link count).
    let entry_change = |k: &mut Vec<(Key, Access)>, parent: Option<MIno>, name: &[u8]| {
        if let Some(p) = parent {
            k.push((Key::Name(p, name.to_vec()), Excl));
            k.push((Key::List(p), Commute));
            k.push((Key::Attr(p), Commute));
        }
    };
    let child = |parent: Option<MIno>, name: &[u8]| {
        parent.and_then(|p| {
            let i = m.get(p);
            (i.kind == Kind::Dir)
                .then(|| i.entries.get(name).copied())
                .flatten()
        })
    };
    match op {
        Op::Create { parent, name, .. }
        | Op::Mkdir { parent, name, .. }
        | Op::Symlink { parent, name, .. } => {
            let p = walk_keys(m, parent, &mut k);
            entry_change(&mut k, p, name);
            if let Some(x) = child(p, name) {
                k.push((Key::Attr(x), Read));
            }
        }
        Op::Link { path, parent, name } => {
            let x = walk_keys(m, path, &mut k);
            let p = walk_keys(m, parent, &mut k);
            entry_change(&mut k, p, name);
            if let Some(x) = x {
                k.push((Key::Attr(x), Excl));
            }
        }
        Op::Unlink { path } | Op::Rmdir { path } => {
            let (pp, name) = crate::ops::split(path);
            let p = walk_keys(m, pp, &mut k);
            entry_change(&mut k, p, name);
            if let Some(x) = child(p, name) {
                k.push((Key::Attr(x), Excl));
                k.push((Key::List(x), Read));
                k.push((Key::Data(x, 0, u64::MAX), Excl));
            }
        }
        Op::Rename {
            path, parent, name, ..
        } => {
            let (pp, n1) = crate::ops::split(path);
            let p1 = walk_keys(m, pp, &mut k);
            let p2 = walk_keys(m, parent, &mut k);
            entry_change(&mut k, p1, n1);
            entry_change(&mut k, p2, name);
            for x in [child(p1, n1), child(p2, name)].into_iter().flatten() {
                k.push((Key::Attr(x), Excl));
                k.push((Key::List(x), Read));
                k.push((Key::Data(x, 0, u64::MAX), Excl));
                if m.get(x).kind == Kind::Dir {
                    k.push((Key::Tree, Excl));
                }
            }
            // The loop check reads the target's ancestors: no directory may move
            // meanwhile.
            k.push((Key::Tree, Read));
        }
        Op::Readlink { path } | Op::Stat { path } => {
            if let Some(x) = walk_keys(m, path, &mut k) {
                k.push((Key::Attr(x), Read));
            }
        }
        Op::Write {
            path, offset, len, ..
        } => {
            if let Some(x) = walk_keys(m, path, &mut k) {
                k.push((Key::Data(x, *offset, offset + len), Excl));
                k.push((Key::Attr(x), Commute));
            }
        }
        Op::Read { path, offset, len } => {
            if let Some(x) = walk_keys(m, path, &mut k) {
                k.push((Key::Data(x, *offset, offset + len), Read));
                if offset + len > m.get(x).size() {
                    k.push((Key::Attr(x), Read));
                }
            }
        }
        Op::Truncate { path, .. } | Op::Chmod { path, .. } | Op::Utimes { path, .. } => {
            if let Some(x) = walk_keys(m, path, &mut k) {
                k.push((Key::Attr(x), Excl));
                k.push((Key::Data(x, 0, u64::MAX), Excl));
            }
        }
        Op::SetXattr { path, name, .. } | Op::RemoveXattr { path, name } => {
            if let Some(x) = walk_keys(m, path, &mut k) {
                k.push((Key::Xattr(x, name.clone()), Excl));
                k.push((Key::XattrList(x), Commute));
                k.push((Key::Attr(x), Commute));
            }
        }
        Op::GetXattr { path, name } => {
            if let Some(x) = walk_keys(m, path, &mut k) {
                k.push((Key::Xattr(x, name.clone()), Read));
            }
        }
        Op::ListXattr { path } => {
            if let Some(x) = walk_keys(m, path, &mut k) {
                k.push((Key::XattrList(x), Read));
            }
        }
        Op::Fsync { path } => {
            walk_keys(m, path, &mut k);
        }
        Op::Readdir { path } => {
            if let Some(x) = walk_keys(m, path, &mut k) {
                k.push((Key::List(x), Read));
                k.push((Key::Attr(x), Read));
            }
        }
        Op::Lseek { path, .. } => {
            if let Some(x) = walk_keys(m, path, &mut k) {
                k.push((Key::Data(x, 0, u64::MAX), Read));
                k.push((Key::Attr(x), Read));
            }
        }
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_follow_the_access_table() {
        let a = vec![(Key::Data(3, 0, 10), Access::Excl)];
        let b = vec![(Key::Data(3, 10, 20), Access::Excl)];
        let c = vec![(Key::Data(3, 5, 6), Access::Read)];
        assert!(!conflict(&a, &b), "disjoint ranges");
        assert!(conflict(&a, &c), "a read of a range being written");
        let l1 = vec![(Key::List(1), Access::Commute)];
        let l2 = vec![(Key::List(1), Access::Commute)];
        let l3 = vec![(Key::List(1), Access::Read)];
        assert!(!conflict(&l1, &l2), "two creates in one directory");
        assert!(conflict(&l1, &l3), "a readdir during a create");
        assert!(!conflict(&l3, &l3), "two readers");
    }
}
