//! The model: the cluster must behave like one POSIX machine. It holds the namespace
//! and every file's bytes as a single local file system would after the operations
//! that completed so far, and checks each operation's outcome against it.
//!
//! Time is checked by windows: an operation that sets a timestamp to "now" ran between
//! its start and its end, so the timestamp must lie in that window (the union of the
//! windows of the operations of one step that set it, since they ran concurrently).
//! Where POSIX or Linux leave the outcome open (which of two errors wins, where a
//! hole starts) the model accepts every allowed answer and says why.

use crate::ops::{self, show_path, AttrView, Op, OpError, Outcome, Path, Value};
use mako_format::inode::Timestamp;
use mako_fs::fs::{S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use std::collections::BTreeMap;

/// A model inode's number (not the core's: the mapping is learned and checked).
pub type MIno = u32;
pub const ROOT: MIno = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

impl Kind {
    fn mode_bits(self) -> u32 {
        match self {
            Kind::File => S_IFREG,
            Kind::Dir => S_IFDIR,
            Kind::Symlink => S_IFLNK,
        }
    }
}

/// A time the file system must report: within `[lo, hi]` (nanoseconds since the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub lo: i128,
    pub hi: i128,
}

pub fn nanos(t: Timestamp) -> i128 {
    t.sec as i128 * 1_000_000_000 + t.nsec as i128
}

impl Window {
    pub fn exact(t: Timestamp) -> Window {
        Window {
            lo: nanos(t),
            hi: nanos(t),
        }
    }
    fn contains(&self, t: Timestamp) -> bool {
        (self.lo..=self.hi).contains(&nanos(t))
    }
    fn union(&self, o: &Window) -> Window {
        Window {
            lo: self.lo.min(o.lo),
            hi: self.hi.max(o.hi),
        }
    }
}

fn show_time(n: i128) -> String {
    format!(
        "{}.{:09}",
        n.div_euclid(1_000_000_000),
        n.rem_euclid(1_000_000_000)
    )
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", show_time(self.lo))
        } else {
            write!(f, "[{}, {}]", show_time(self.lo), show_time(self.hi))
        }
    }
}

/// A timestamp and the step that last set it (to merge the windows of one step).
#[derive(Clone, Copy, Debug)]
struct Stamp {
    window: Window,
    step: u64,
}

#[derive(Clone, Debug)]
pub struct MInode {
    pub kind: Kind,
    /// Permission bits (`mode & 0o7777`).
    pub perm: u32,
    pub nlink: u32,
    /// File bytes, or a symlink's target.
    pub data: Vec<u8>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Directory entries.
    pub entries: BTreeMap<Vec<u8>, MIno>,
    /// A directory's parent.
    pub parent: MIno,
    mtime: Stamp,
    ctime: Stamp,
    /// The core's inode number, once an operation reported it.
    pub real: Option<u64>,
}

impl MInode {
    fn new(kind: Kind, perm: u32, parent: MIno, w: Window, step: u64) -> MInode {
        let s = Stamp { window: w, step };
        MInode {
            kind,
            perm,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            data: Vec::new(),
            xattrs: BTreeMap::new(),
            entries: BTreeMap::new(),
            parent,
            mtime: s,
            ctime: s,
            real: None,
        }
    }
    pub fn size(&self) -> u64 {
        self.data.len() as u64
    }
}

/// The expected outcome of an operation.
enum Expect {
    /// Succeeds with exactly this value.
    Is(Value),
    /// Succeeds; the value is checked by the model afterwards.
    Checked,
    /// Fails with one of these errnos (several where the order of checks is open).
    Fails(&'static [i32], &'static str),
}

#[derive(Clone)]
pub struct Model {
    pub inodes: BTreeMap<MIno, MInode>,
    next: MIno,
    /// Live core inode numbers and their model inodes.
    real: BTreeMap<u64, MIno>,
    step: u64,
    block_bytes: u64,
}

const ENOENT: &[i32] = &[libc::ENOENT];
const ENOTDIR: &[i32] = &[libc::ENOTDIR];

impl Model {
    /// An empty file system: the root directory, whose core inode is `root_real`.
    pub fn new(root_real: u64, block_bytes: u64, root_times: Window) -> Model {
        let mut root = MInode::new(Kind::Dir, 0o755, ROOT, root_times, 0);
        root.real = Some(root_real);
        let mut inodes = BTreeMap::new();
        inodes.insert(ROOT, root);
        Model {
            inodes,
            next: ROOT + 1,
            real: [(root_real, ROOT)].into_iter().collect(),
            step: 0,
            block_bytes,
        }
    }

    /// Operations from now on belong to step `step`.
    pub fn begin_step(&mut self, step: u64) {
        self.step = step;
    }

    pub fn get(&self, i: MIno) -> &MInode {
        &self.inodes[&i]
    }

    /// The inode at `path`, or the errno a lookup gives.
    pub fn walk(&self, path: &[Vec<u8>]) -> Result<MIno, i32> {
        let mut cur = ROOT;
        for c in path {
            let i = self.get(cur);
            if i.kind != Kind::Dir {
                return Err(libc::ENOTDIR);
            }
            cur = *i.entries.get(c).ok_or(libc::ENOENT)?;
        }
        Ok(cur)
    }

    /// Every name in the file system with its inode, parents before children.
    pub fn all_paths(&self) -> Vec<(Path, MIno)> {
        let mut out = vec![(Vec::new(), ROOT)];
        let mut i = 0;
        while i < out.len() {
            let (p, ino) = out[i].clone();
            for (name, child) in &self.get(ino).entries {
                let mut c = p.clone();
                c.push(name.clone());
                out.push((c, *child));
            }
            i += 1;
        }
        out
    }

    /// Bytes of file data the model holds (to keep the disks from filling).
    pub fn data_bytes(&self) -> u64 {
        self.inodes
            .values()
            .filter(|i| i.kind == Kind::File)
            .map(|i| i.size().div_ceil(self.block_bytes) * self.block_bytes)
            .sum()
    }

    fn alloc(&mut self, i: MInode) -> MIno {
        let n = self.next;
        self.next += 1;
        self.inodes.insert(n, i);
        n
    }

    fn touch_m(&mut self, i: MIno, w: Window) {
        let step = self.step;
        let s = &mut self.inodes.get_mut(&i).expect("inode").mtime;
        s.window = if s.step == step {
            s.window.union(&w)
        } else {
            w
        };
        s.step = step;
    }
    fn touch_c(&mut self, i: MIno, w: Window) {
        let step = self.step;
        let s = &mut self.inodes.get_mut(&i).expect("inode").ctime;
        s.window = if s.step == step {
            s.window.union(&w)
        } else {
            w
        };
        s.step = step;
    }
    fn touch_mc(&mut self, i: MIno, w: Window) {
        self.touch_m(i, w);
        self.touch_c(i, w);
    }

    fn unlink_inode(&mut self, i: MIno) {
        let n = self.inodes.get_mut(&i).expect("inode");
        n.nlink = n.nlink.saturating_sub(1);
        if n.nlink == 0 || n.kind == Kind::Dir {
            self.drop_inode(i);
        }
    }

    fn drop_inode(&mut self, i: MIno) {
        if let Some(n) = self.inodes.remove(&i) {
            if let Some(r) = n.real {
                self.real.remove(&r);
            }
        }
    }

    /// Record the core's inode number of a new model inode.
    fn learn(&mut self, i: MIno, real: u64) -> Result<(), String> {
        if let Some(other) = self.real.get(&real) {
            if *other != i {
                return Err(format!(
                    "inode number {real} was handed out again while it still belongs to {}",
                    self.describe(*other)
                ));
            }
        }
        self.real.insert(real, i);
        self.inodes.get_mut(&i).expect("inode").real = Some(real);
        Ok(())
    }

    /// A name of inode `i`, for messages.
    pub fn describe(&self, i: MIno) -> String {
        self.all_paths()
            .into_iter()
            .find(|(_, x)| *x == i)
            .map(|(p, _)| show_path(&p))
            .unwrap_or_else(|| format!("model inode {i}"))
    }

    fn check_real(&self, i: MIno, real: u64, what: &str) -> Result<(), String> {
        match self.get(i).real {
            Some(r) if r == real => Ok(()),
            Some(r) => Err(format!(
                "{what}: inode number {real}, but {} is inode {r}",
                self.describe(i)
            )),
            None => Err(format!(
                "{what}: {} has no known inode number",
                self.describe(i)
            )),
        }
    }

    /// Compare attributes with the model's inode `i`.
    fn check_attr(&self, i: MIno, a: &AttrView) -> Result<(), String> {
        let m = self.get(i);
        self.check_real(i, a.ino, "attributes")?;
        let mut bad = Vec::new();
        if a.mode & S_IFMT != m.kind.mode_bits() {
            bad.push(format!(
                "type {:o}, expected {:o}",
                a.mode & S_IFMT,
                m.kind.mode_bits()
            ));
        }
        if a.mode & 0o7777 != m.perm {
            bad.push(format!("mode {:o}, expected {:o}", a.mode & 0o7777, m.perm));
        }
        if m.kind != Kind::Dir && a.size != m.size() {
            bad.push(format!("size {}, expected {}", a.size, m.size()));
        }
        if a.nlink != m.nlink {
            bad.push(format!("nlink {}, expected {}", a.nlink, m.nlink));
        }
        if !m.mtime.window.contains(a.mtime) {
            bad.push(format!(
                "mtime {}, expected {}",
                show_time(nanos(a.mtime)),
                m.mtime.window
            ));
        }
        if !m.ctime.window.contains(a.ctime) {
            bad.push(format!(
                "ctime {}, expected {}",
                show_time(nanos(a.ctime)),
                m.ctime.window
            ));
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "attributes of {} (inode {}): {}",
                self.describe(i),
                a.ino,
                bad.join("; ")
            ))
        }
    }

    /// Check the outcome of `op`, which ran within `window`, and apply it. Operations
    /// of one step commute (the planner sees to it), so they may be checked in any
    /// order.
    pub fn check_and_apply(
        &mut self,
        op: &Op,
        got: &Outcome,
        window: Window,
    ) -> Result<(), String> {
        let expect = self.expect_and_apply(op, got, window)?;
        match (expect, got) {
            (Expect::Is(v), Ok(g)) if v == *g => Ok(()),
            (Expect::Is(v), Ok(g)) => Err(mismatch(&v, g)),
            (Expect::Checked, Ok(_)) => Ok(()),
            (Expect::Fails(errs, _), Err(e)) if errs.contains(&e.errno) => Ok(()),
            (Expect::Is(v), Err(e)) => Err(format!(
                "expected {}, got {}",
                v,
                ops::show_outcome(&Err(e.clone()))
            )),
            (Expect::Checked, Err(e)) => Err(format!(
                "expected success, got {}",
                ops::show_outcome(&Err(e.clone()))
            )),
            (Expect::Fails(errs, why), got) => Err(format!(
                "expected {} ({why}), got {}",
                errs.iter()
                    .map(|e| ops::errno_name(*e))
                    .collect::<Vec<_>>()
                    .join(" or "),
                ops::show_outcome(got)
            )),
        }
    }

    /// What `op` must return; applies its effect when it must succeed. `got` is used
    /// only to learn new inode numbers and to check values the model cannot predict
    /// exactly (lseek, attributes with time windows).
    fn expect_and_apply(&mut self, op: &Op, got: &Outcome, w: Window) -> Result<Expect, String> {
        macro_rules! walk {
            ($p:expr) => {
                match self.walk($p) {
                    Ok(i) => i,
                    Err(libc::ENOENT) => {
                        return Ok(Expect::Fails(ENOENT, "a path component does not exist"))
                    }
                    Err(_) => {
                        return Ok(Expect::Fails(
                            ENOTDIR,
                            "a path component is not a directory",
                        ))
                    }
                }
            };
        }
        macro_rules! dir {
            ($p:expr) => {{
                let d = walk!($p);
                if self.get(d).kind != Kind::Dir {
                    return Ok(Expect::Fails(ENOTDIR, "the parent is not a directory"));
                }
                d
            }};
        }
        let got_attr = || match got {
            Ok(Value::Attr(a)) => Some(a.clone()),
            _ => None,
        };
        Ok(match op {
            Op::Create {
                parent,
                name,
                perm,
                exclusive,
            } => {
                let p = dir!(parent);
                if let Some(&x) = self.get(p).entries.get(name) {
                    if *exclusive {
                        return Ok(Expect::Fails(&[libc::EEXIST], "O_EXCL and the name exists"));
                    }
                    if self.get(x).kind == Kind::Dir {
                        return Ok(Expect::Fails(&[libc::EISDIR], "the name is a directory"));
                    }
                    if let Some(a) = got_attr() {
                        self.check_attr(x, &a)?;
                    }
                    return Ok(Expect::Checked);
                }
                let Some(a) = got_attr() else {
                    return Ok(Expect::Checked);
                };
                let i = self.alloc(MInode::new(
                    Kind::File,
                    perm & 0o7777 & !0o022,
                    p,
                    w,
                    self.step,
                ));
                self.inodes
                    .get_mut(&p)
                    .expect("parent")
                    .entries
                    .insert(name.clone(), i);
                self.touch_mc(p, w);
                self.learn(i, a.ino)?;
                self.check_attr(i, &a)?;
                Expect::Checked
            }
            Op::Mkdir { parent, name, perm } => {
                let p = dir!(parent);
                if self.get(p).entries.contains_key(name) {
                    return Ok(Expect::Fails(&[libc::EEXIST], "the name exists"));
                }
                let Some(a) = got_attr() else {
                    return Ok(Expect::Checked);
                };
                let i = self.alloc(MInode::new(
                    Kind::Dir,
                    perm & 0o7777 & !0o022,
                    p,
                    w,
                    self.step,
                ));
                let pi = self.inodes.get_mut(&p).expect("parent");
                pi.entries.insert(name.clone(), i);
                pi.nlink += 1;
                self.touch_mc(p, w);
                self.learn(i, a.ino)?;
                self.check_attr(i, &a)?;
                Expect::Checked
            }
            Op::Symlink {
                parent,
                name,
                target,
            } => {
                let p = dir!(parent);
                if self.get(p).entries.contains_key(name) {
                    return Ok(Expect::Fails(&[libc::EEXIST], "the name exists"));
                }
                let Some(a) = got_attr() else {
                    return Ok(Expect::Checked);
                };
                let mut n = MInode::new(Kind::Symlink, 0o777, p, w, self.step);
                n.data = target.clone();
                let i = self.alloc(n);
                self.inodes
                    .get_mut(&p)
                    .expect("parent")
                    .entries
                    .insert(name.clone(), i);
                self.touch_mc(p, w);
                self.learn(i, a.ino)?;
                self.check_attr(i, &a)?;
                Expect::Checked
            }
            Op::Link { path, parent, name } => {
                let x = walk!(path);
                let p = dir!(parent);
                if self.get(x).kind == Kind::Dir {
                    return Ok(Expect::Fails(&[libc::EPERM], "hard link to a directory"));
                }
                if self.get(p).entries.contains_key(name) {
                    return Ok(Expect::Fails(&[libc::EEXIST], "the new name exists"));
                }
                let Some(a) = got_attr() else {
                    return Ok(Expect::Checked);
                };
                self.inodes
                    .get_mut(&p)
                    .expect("parent")
                    .entries
                    .insert(name.clone(), x);
                self.inodes.get_mut(&x).expect("inode").nlink += 1;
                self.touch_mc(p, w);
                self.touch_c(x, w);
                self.check_attr(x, &a)?;
                Expect::Checked
            }
            Op::Unlink { path } => {
                let (pp, name) = ops::split(path);
                let p = dir!(pp);
                let Some(&x) = self.get(p).entries.get(name) else {
                    return Ok(Expect::Fails(ENOENT, "no such name"));
                };
                if self.get(x).kind == Kind::Dir {
                    return Ok(Expect::Fails(&[libc::EISDIR], "unlink of a directory"));
                }
                if got.is_ok() {
                    self.inodes
                        .get_mut(&p)
                        .expect("parent")
                        .entries
                        .remove(name);
                    self.touch_mc(p, w);
                    self.touch_c(x, w);
                    self.unlink_inode(x);
                }
                Expect::Is(Value::Unit)
            }
            Op::Rmdir { path } => {
                let (pp, name) = ops::split(path);
                let p = dir!(pp);
                let Some(&x) = self.get(p).entries.get(name) else {
                    return Ok(Expect::Fails(ENOENT, "no such name"));
                };
                if self.get(x).kind != Kind::Dir {
                    return Ok(Expect::Fails(ENOTDIR, "rmdir of a non-directory"));
                }
                if !self.get(x).entries.is_empty() {
                    return Ok(Expect::Fails(
                        &[libc::ENOTEMPTY],
                        "the directory is not empty",
                    ));
                }
                if got.is_ok() {
                    let pi = self.inodes.get_mut(&p).expect("parent");
                    pi.entries.remove(name);
                    pi.nlink -= 1;
                    self.touch_mc(p, w);
                    self.drop_inode(x);
                }
                Expect::Is(Value::Unit)
            }
            Op::Rename {
                path,
                parent,
                name,
                flags,
            } => return self.rename(path, parent, name, *flags, got, w),
            Op::Readlink { path } => {
                let x = walk!(path);
                if self.get(x).kind != Kind::Symlink {
                    return Ok(Expect::Fails(&[libc::EINVAL], "not a symlink"));
                }
                Expect::Is(Value::Bytes(self.get(x).data.clone()))
            }
            Op::Write {
                path,
                offset,
                len,
                data_seed,
            } => {
                let x = walk!(path);
                if self.get(x).kind == Kind::Dir {
                    return Ok(Expect::Fails(&[libc::EISDIR], "write to a directory"));
                }
                if got.is_ok() {
                    let data = ops::pattern(*data_seed, *len as usize);
                    let f = &mut self.inodes.get_mut(&x).expect("inode").data;
                    let end = (*offset + *len) as usize;
                    if f.len() < end {
                        f.resize(end, 0);
                    }
                    f[*offset as usize..end].copy_from_slice(&data);
                    self.touch_mc(x, w);
                }
                Expect::Is(Value::Count(*len))
            }
            Op::Read { path, offset, len } => {
                let x = walk!(path);
                if self.get(x).kind == Kind::Dir {
                    return Ok(Expect::Fails(&[libc::EISDIR], "read of a directory"));
                }
                let d = &self.get(x).data;
                let lo = (*offset as usize).min(d.len());
                let hi = ((*offset + *len) as usize).min(d.len());
                Expect::Is(Value::Bytes(d[lo..hi].to_vec()))
            }
            Op::Truncate { path, size } => {
                let x = walk!(path);
                match self.get(x).kind {
                    Kind::Dir => {
                        return Ok(Expect::Fails(&[libc::EISDIR], "truncate of a directory"))
                    }
                    Kind::Symlink => {
                        return Ok(Expect::Fails(&[libc::EINVAL], "truncate of a symlink"))
                    }
                    Kind::File => {}
                }
                if got.is_ok() {
                    self.inodes
                        .get_mut(&x)
                        .expect("inode")
                        .data
                        .resize(*size as usize, 0);
                    self.touch_mc(x, w);
                }
                Expect::Is(Value::Unit)
            }
            Op::Chmod { path, perm } => {
                let x = walk!(path);
                if got.is_ok() {
                    self.inodes.get_mut(&x).expect("inode").perm = perm & 0o7777;
                    self.touch_c(x, w);
                }
                Expect::Is(Value::Unit)
            }
            Op::Utimes { path, mtime, .. } => {
                let x = walk!(path);
                if got.is_ok() {
                    let step = self.step;
                    self.inodes.get_mut(&x).expect("inode").mtime = Stamp {
                        window: Window::exact(*mtime),
                        step,
                    };
                    self.touch_c(x, w);
                }
                Expect::Is(Value::Unit)
            }
            Op::SetXattr {
                path,
                name,
                value,
                flags,
            } => {
                let x = walk!(path);
                let m = self.get(x);
                if m.kind == Kind::Symlink && name.starts_with(b"user.") {
                    return Ok(Expect::Fails(
                        &[libc::EPERM],
                        "user.* attributes only on files and directories",
                    ));
                }
                let exists = m.xattrs.contains_key(name);
                if exists && flags & libc::XATTR_CREATE != 0 {
                    return Ok(Expect::Fails(
                        &[libc::EEXIST],
                        "XATTR_CREATE and the attribute exists",
                    ));
                }
                if !exists && flags & libc::XATTR_REPLACE != 0 {
                    return Ok(Expect::Fails(
                        &[libc::ENODATA],
                        "XATTR_REPLACE and no such attribute",
                    ));
                }
                if got.is_ok() {
                    self.inodes
                        .get_mut(&x)
                        .expect("inode")
                        .xattrs
                        .insert(name.clone(), value.clone());
                    self.touch_c(x, w);
                }
                Expect::Is(Value::Unit)
            }
            Op::GetXattr { path, name } => {
                let x = walk!(path);
                match self.get(x).xattrs.get(name) {
                    Some(v) => Expect::Is(Value::Bytes(v.clone())),
                    None => Expect::Fails(&[libc::ENODATA], "no such attribute"),
                }
            }
            Op::ListXattr { path } => {
                let x = walk!(path);
                Expect::Is(Value::Names(self.get(x).xattrs.keys().cloned().collect()))
            }
            Op::RemoveXattr { path, name } => {
                let x = walk!(path);
                if !self.get(x).xattrs.contains_key(name) {
                    return Ok(Expect::Fails(&[libc::ENODATA], "no such attribute"));
                }
                if got.is_ok() {
                    self.inodes.get_mut(&x).expect("inode").xattrs.remove(name);
                    self.touch_c(x, w);
                }
                Expect::Is(Value::Unit)
            }
            Op::Fsync { path } => {
                walk!(path);
                Expect::Is(Value::Unit)
            }
            Op::Readdir { path } => {
                let x = walk!(path);
                let m = self.get(x);
                if m.kind != Kind::Dir {
                    return Ok(Expect::Fails(ENOTDIR, "readdir of a non-directory"));
                }
                let real = |i: MIno| self.get(i).real.unwrap_or(u64::MAX);
                let mut e: Vec<(Vec<u8>, u64)> =
                    vec![(b".".to_vec(), real(x)), (b"..".to_vec(), real(m.parent))];
                e.extend(m.entries.iter().map(|(n, i)| (n.clone(), real(*i))));
                e.sort();
                Expect::Is(Value::Entries(e))
            }
            Op::Stat { path } => {
                let x = walk!(path);
                if let Some(a) = got_attr() {
                    self.check_attr(x, &a)?;
                }
                Expect::Checked
            }
            Op::Lseek {
                path,
                offset,
                whence,
            } => {
                let x = walk!(path);
                if self.get(x).kind == Kind::Dir {
                    // A directory's size is the file system's own (its blocks): Linux
                    // file systems seek in it as in one run of data up to that size.
                    // Any offset at or past the one asked, or ENXIO past the end.
                    return match got {
                        Ok(Value::Offset(o)) if *o >= *offset => Ok(Expect::Checked),
                        Err(e) if e.errno == libc::ENXIO => {
                            Ok(Expect::Fails(&[libc::ENXIO], "past the directory's end"))
                        }
                        _ => Err(format!(
                            "lseek of a directory from {offset}: neither an offset at or past it nor ENXIO"
                        )),
                    };
                }
                let d = &self.get(x).data;
                let size = d.len() as u64;
                if *offset >= size {
                    return Ok(Expect::Fails(
                        &[libc::ENXIO],
                        "offset at or past the end of file",
                    ));
                }
                let zero = |lo: u64, hi: u64| d[lo as usize..hi as usize].iter().all(|b| *b == 0);
                let bb = self.block_bytes;
                // SEEK_DATA may report data early (a file system need not find every
                // hole), never late: what it skips must read as zeros. SEEK_HOLE may
                // report a hole late (at the end of file at worst), never where there
                // is data: the block it starts in must read as zeros.
                let data_ok = |o: u64| o >= *offset && o < size && zero(*offset, o);
                let hole_ok = |o: u64| {
                    let end = ((o / bb + 1) * bb).min(size);
                    o >= *offset && o <= size && (o == size || zero(o, end))
                };
                let seek_data = *whence == libc::SEEK_DATA;
                match got {
                    Ok(Value::Offset(o)) if seek_data && !data_ok(*o) => {
                        return Err(format!(
                            "SEEK_DATA from {offset} returned {o}: out of range, or the file ({size} bytes) has data in [{offset}, {o})"
                        ));
                    }
                    Ok(Value::Offset(o)) if !seek_data && !hole_ok(*o) => {
                        return Err(format!(
                            "SEEK_HOLE from {offset} returned {o}: out of range, or the block there holds data (size {size})"
                        ));
                    }
                    Err(e) if e.errno == libc::ENXIO && seek_data => {
                        if !zero(*offset, size) {
                            return Err(format!(
                                "SEEK_DATA from {offset} said ENXIO but the file has data after it (size {size})"
                            ));
                        }
                        return Ok(Expect::Fails(&[libc::ENXIO], "only zeros after the offset"));
                    }
                    _ => {}
                }
                Expect::Checked
            }
        })
    }

    fn rename(
        &mut self,
        path: &Path,
        parent: &Path,
        name: &[u8],
        flags: u32,
        got: &Outcome,
        w: Window,
    ) -> Result<Expect, String> {
        let (pp1, n1) = ops::split(path);
        let p1 = match self.walk(pp1) {
            Ok(i) => i,
            Err(e) => {
                return Ok(Expect::Fails(
                    if e == libc::ENOENT { ENOENT } else { ENOTDIR },
                    "source path",
                ))
            }
        };
        let p2 = match self.walk(parent) {
            Ok(i) => i,
            Err(e) => {
                return Ok(Expect::Fails(
                    if e == libc::ENOENT { ENOENT } else { ENOTDIR },
                    "target path",
                ))
            }
        };
        if self.get(p1).kind != Kind::Dir || self.get(p2).kind != Kind::Dir {
            return Ok(Expect::Fails(ENOTDIR, "a parent is not a directory"));
        }
        let Some(&src) = self.get(p1).entries.get(n1) else {
            return Ok(Expect::Fails(ENOENT, "no such source"));
        };
        let dst = self.get(p2).entries.get(name).copied();
        if dst == Some(src) {
            // Two names of one inode: rename does nothing. Linux's VFS refuses
            // RENAME_NOREPLACE before the file system sees it; either is POSIX-fine.
            if flags == ops::RENAME_NOREPLACE {
                return Ok(match got {
                    Err(_) => Expect::Fails(
                        &[libc::EEXIST],
                        "RENAME_NOREPLACE over a name of the same inode",
                    ),
                    Ok(_) => Expect::Is(Value::Unit),
                });
            }
            return Ok(Expect::Is(Value::Unit));
        }
        let src_dir = self.get(src).kind == Kind::Dir;
        let ancestors = |m: &Model, mut d: MIno| {
            let mut v = vec![d];
            while d != ROOT {
                d = m.get(d).parent;
                v.push(d);
            }
            v
        };
        if src_dir && p1 != p2 && ancestors(self, p2).contains(&src) {
            return Ok(Expect::Fails(
                &[libc::EINVAL],
                "a directory cannot move into itself",
            ));
        }
        if flags == ops::RENAME_EXCHANGE {
            let Some(dst) = dst else {
                return Ok(Expect::Fails(ENOENT, "RENAME_EXCHANGE with no target"));
            };
            let dst_dir = self.get(dst).kind == Kind::Dir;
            if dst_dir && p1 != p2 && ancestors(self, p1).contains(&dst) {
                return Ok(Expect::Fails(
                    &[libc::EINVAL],
                    "a directory cannot move into itself",
                ));
            }
            if got.is_ok() {
                self.inodes
                    .get_mut(&p1)
                    .expect("p1")
                    .entries
                    .insert(n1.to_vec(), dst);
                self.inodes
                    .get_mut(&p2)
                    .expect("p2")
                    .entries
                    .insert(name.to_vec(), src);
                if p1 != p2 {
                    if src_dir != dst_dir {
                        let (from, to) = if src_dir { (p1, p2) } else { (p2, p1) };
                        self.inodes.get_mut(&from).expect("from").nlink -= 1;
                        self.inodes.get_mut(&to).expect("to").nlink += 1;
                    }
                    if src_dir {
                        self.inodes.get_mut(&src).expect("src").parent = p2;
                    }
                    if dst_dir {
                        self.inodes.get_mut(&dst).expect("dst").parent = p1;
                    }
                    // Mako updates the ctime of exchanged inodes only when they
                    // change parents (Linux's local file systems always do; POSIX has
                    // no exchange).
                    self.touch_c(src, w);
                    self.touch_c(dst, w);
                }
                self.touch_mc(p1, w);
                self.touch_mc(p2, w);
            }
            return Ok(Expect::Is(Value::Unit));
        }
        if let Some(d) = dst {
            if flags == ops::RENAME_NOREPLACE {
                return Ok(Expect::Fails(
                    &[libc::EEXIST],
                    "RENAME_NOREPLACE and the target exists",
                ));
            }
            if ancestors(self, p1).contains(&d) {
                return Ok(Expect::Fails(
                    &[libc::ENOTEMPTY],
                    "the target is an ancestor of the source",
                ));
            }
            let dst_dir = self.get(d).kind == Kind::Dir;
            if src_dir && !dst_dir {
                return Ok(Expect::Fails(ENOTDIR, "a directory over a non-directory"));
            }
            if !src_dir && dst_dir {
                return Ok(Expect::Fails(
                    &[libc::EISDIR],
                    "a non-directory over a directory",
                ));
            }
            if dst_dir && !self.get(d).entries.is_empty() {
                return Ok(Expect::Fails(
                    &[libc::ENOTEMPTY],
                    "the target directory is not empty",
                ));
            }
        }
        if got.is_ok() {
            self.inodes.get_mut(&p1).expect("p1").entries.remove(n1);
            self.inodes
                .get_mut(&p2)
                .expect("p2")
                .entries
                .insert(name.to_vec(), src);
            if let Some(d) = dst {
                if self.get(d).kind == Kind::Dir {
                    self.inodes.get_mut(&p2).expect("p2").nlink -= 1;
                    self.drop_inode(d);
                } else {
                    self.touch_c(d, w);
                    self.unlink_inode(d);
                }
            }
            if src_dir && p1 != p2 {
                self.inodes.get_mut(&p1).expect("p1").nlink -= 1;
                self.inodes.get_mut(&p2).expect("p2").nlink += 1;
                self.inodes.get_mut(&src).expect("src").parent = p2;
            }
            self.touch_c(src, w);
            self.touch_mc(p1, w);
            self.touch_mc(p2, w);
        }
        Ok(Expect::Is(Value::Unit))
    }
}

fn mismatch(expected: &Value, got: &Value) -> String {
    match (expected, got) {
        (Value::Bytes(e), Value::Bytes(g)) => {
            let first = e.iter().zip(g.iter()).position(|(a, b)| a != b);
            match first {
                Some(at) => {
                    let run = e[at..]
                        .iter()
                        .zip(&g[at..])
                        .take_while(|(a, b)| a != b)
                        .count();
                    format!(
                        "expected {} bytes, got {}: first difference at byte {at} (expected {:#04x}, got {:#04x}; {run} bytes differ from there){}",
                        e.len(),
                        g.len(),
                        e[at],
                        g[at],
                        if g[at..at + run].iter().all(|b| *b == 0) { ", got zeros: a lost write or a stale cache" } else { "" }
                    )
                }
                None => format!(
                    "expected {} bytes, got {} (equal up to the shorter)",
                    e.len(),
                    g.len()
                ),
            }
        }
        _ => format!("expected {expected}, got {got}"),
    }
}

/// An `OpError` for results the harness itself refuses.
pub fn harness_error(message: String) -> OpError {
    OpError {
        errno: libc::EIO,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::AttrView;

    const T0: i128 = 1_000_000_000_000_000_000;

    fn ts(n: i128) -> Timestamp {
        Timestamp {
            sec: (n / 1_000_000_000) as i64,
            nsec: (n % 1_000_000_000) as u32,
        }
    }
    fn w(lo: i128, hi: i128) -> Window {
        Window {
            lo: T0 + lo,
            hi: T0 + hi,
        }
    }
    fn attr(ino: u64, mode: u32, size: u64, nlink: u32, t: i128) -> Outcome {
        Ok(Value::Attr(AttrView {
            ino,
            mode,
            size,
            nlink,
            mtime: ts(T0 + t),
            ctime: ts(T0 + t),
        }))
    }
    fn name(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    /// A model with /a (inode 16) holding "hello" written at time 20.
    fn with_file() -> Model {
        let mut m = Model::new(1, 65536, w(0, 0));
        m.begin_step(1);
        let create = Op::Create {
            parent: vec![],
            name: name("a"),
            perm: 0o644,
            exclusive: true,
        };
        m.check_and_apply(&create, &attr(16, 0o100644, 0, 1, 10), w(5, 15))
            .expect("create");
        m.begin_step(2);
        let write = Op::Write {
            path: vec![name("a")],
            offset: 0,
            len: 5,
            data_seed: 3,
        };
        m.check_and_apply(&write, &Ok(Value::Count(5)), w(18, 22))
            .expect("write");
        m
    }

    #[test]
    fn reads_must_return_what_was_written() {
        let mut m = with_file();
        let read = Op::Read {
            path: vec![name("a")],
            offset: 0,
            len: 100,
        };
        let good = Ok(Value::Bytes(ops::pattern(3, 5)));
        m.check_and_apply(&read, &good, w(30, 31))
            .expect("the written bytes");
        let stale = Ok(Value::Bytes(vec![0; 5]));
        let e = m.check_and_apply(&read, &stale, w(30, 31)).unwrap_err();
        assert!(e.contains("got zeros"), "{e}");
        let short = Ok(Value::Bytes(ops::pattern(3, 4)));
        assert!(m.check_and_apply(&read, &short, w(30, 31)).is_err());
    }

    #[test]
    fn stat_checks_size_links_and_time_windows() {
        let mut m = with_file();
        let stat = Op::Stat {
            path: vec![name("a")],
        };
        m.check_and_apply(&stat, &attr(16, 0o100644, 5, 1, 20), w(30, 31))
            .expect("good attributes");
        for (bad, what) in [
            (attr(16, 0o100644, 4, 1, 20), "size"),
            (attr(16, 0o100644, 5, 2, 20), "nlink"),
            (attr(16, 0o100644, 5, 1, 17), "mtime"),
            (attr(17, 0o100644, 5, 1, 20), "inode number"),
        ] {
            let e = m.check_and_apply(&stat, &bad, w(30, 31)).unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
        let gone = Err(OpError {
            errno: libc::ENOENT,
            message: "gone".into(),
        });
        assert!(
            m.check_and_apply(&stat, &gone, w(30, 31)).is_err(),
            "a lost name"
        );
    }

    #[test]
    fn a_name_cannot_come_back_and_an_inode_number_cannot_be_given_twice() {
        let mut m = with_file();
        m.begin_step(3);
        let unlink = Op::Unlink {
            path: vec![name("a")],
        };
        m.check_and_apply(&unlink, &Ok(Value::Unit), w(40, 41))
            .expect("unlink");
        let stat = Op::Stat {
            path: vec![name("a")],
        };
        let e = m
            .check_and_apply(&stat, &attr(16, 0o100644, 5, 1, 20), w(50, 51))
            .unwrap_err();
        assert!(e.contains("expected ENOENT"), "a resurrected name: {e}");
        // /b takes inode 16 (freed: fine), then /c may not take it too.
        m.begin_step(4);
        let mk = |n: &str| Op::Create {
            parent: vec![],
            name: name(n),
            perm: 0o644,
            exclusive: true,
        };
        m.check_and_apply(&mk("b"), &attr(16, 0o100644, 0, 1, 60), w(55, 65))
            .expect("reuse of a freed number");
        let e = m
            .check_and_apply(&mk("c"), &attr(16, 0o100644, 0, 1, 60), w(55, 65))
            .unwrap_err();
        assert!(e.contains("handed out again"), "{e}");
    }

    #[test]
    fn a_rename_seen_half_done_matches_neither_side() {
        let mut m = with_file();
        let before = m.clone();
        m.begin_step(3);
        let rename = Op::Rename {
            path: vec![name("a")],
            parent: vec![],
            name: name("b"),
            flags: 0,
        };
        m.check_and_apply(&rename, &Ok(Value::Unit), w(40, 41))
            .expect("rename");
        let readdir = Op::Readdir { path: vec![] };
        let listing = |names: &[&str]| {
            let mut e: Vec<(Vec<u8>, u64)> = vec![(name("."), 1), (name(".."), 1)];
            e.extend(names.iter().map(|n| (name(n), 16)));
            e.sort();
            Ok(Value::Entries(e))
        };
        assert!(before
            .clone()
            .check_and_apply(&readdir, &listing(&["a"]), w(40, 41))
            .is_ok());
        assert!(m
            .clone()
            .check_and_apply(&readdir, &listing(&["b"]), w(40, 41))
            .is_ok());
        for half in [listing(&["a", "b"]), listing(&[])] {
            assert!(before
                .clone()
                .check_and_apply(&readdir, &half, w(40, 41))
                .is_err());
            assert!(m
                .clone()
                .check_and_apply(&readdir, &half, w(40, 41))
                .is_err());
        }
    }
}
