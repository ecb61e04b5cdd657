//! The in-memory model of the file system the crash test drives: the namespace, every
//! file's content and the attributes the check compares (kind, mode, size, nlink,
//! xattrs, symlink target), and its canonical form — what a recovered file system is
//! compared with, independent of inode numbers and timestamps.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A model inode: stands for one file system inode over the whole run (inode numbers
/// are the file system's business; the check never compares them).
pub type Mid = u64;
pub const ROOT: Mid = 0;

pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;

/// Granularity of the model's file content (independent of the file system's blocks).
pub const CHUNK_BYTES: u64 = 64 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

impl Kind {
    pub fn type_bits(self) -> u32 {
        match self {
            Kind::File => S_IFREG,
            Kind::Dir => S_IFDIR,
            Kind::Symlink => S_IFLNK,
        }
    }
    pub fn from_mode(mode: u32) -> Option<Kind> {
        match mode & 0o170000 {
            S_IFREG => Some(Kind::File),
            S_IFDIR => Some(Kind::Dir),
            S_IFLNK => Some(Kind::Symlink),
            _ => None,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::File => "file",
            Kind::Dir => "directory",
            Kind::Symlink => "symlink",
        })
    }
}

/// Sparse file content: fixed-size chunks, absent chunks are zeros. Invariant: no
/// chunk lies wholly at or past `size`, and bytes past `size` are zero, so that two
/// equal contents hash equally whatever their history.
#[derive(Debug, Clone, Default)]
pub struct FileData {
    pub size: u64,
    chunks: BTreeMap<u64, Arc<Vec<u8>>>,
}

impl FileData {
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let end = offset + data.len() as u64;
        let mut pos = offset;
        while pos < end {
            let idx = pos / CHUNK_BYTES;
            let within = (pos % CHUNK_BYTES) as usize;
            let n = ((CHUNK_BYTES as usize - within) as u64).min(end - pos) as usize;
            let chunk = self
                .chunks
                .entry(idx)
                .or_insert_with(|| Arc::new(vec![0u8; CHUNK_BYTES as usize]));
            let src = (pos - offset) as usize;
            Arc::make_mut(chunk)[within..within + n].copy_from_slice(&data[src..src + n]);
            pos += n as u64;
        }
        self.size = self.size.max(end);
    }

    pub fn truncate(&mut self, new: u64) {
        if new < self.size {
            let first_gone = new.div_ceil(CHUNK_BYTES);
            self.chunks.retain(|&i, _| i < first_gone);
            if !new.is_multiple_of(CHUNK_BYTES) {
                if let Some(c) = self.chunks.get_mut(&(new / CHUNK_BYTES)) {
                    Arc::make_mut(c)[(new % CHUNK_BYTES) as usize..].fill(0);
                }
            }
        }
        self.size = new;
    }

    /// Bytes [offset, offset+len) (zeros past the end).
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        for (&idx, c) in self
            .chunks
            .range(offset / CHUNK_BYTES..=(offset + len as u64) / CHUNK_BYTES)
        {
            let cs = idx * CHUNK_BYTES;
            let lo = offset.max(cs);
            let hi = (offset + len as u64).min(cs + CHUNK_BYTES);
            if lo < hi {
                out[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&c[(lo - cs) as usize..(hi - cs) as usize]);
            }
        }
        out
    }

    pub fn content_hash(&self) -> u64 {
        let mut h = ContentHasher::new(self.size);
        for (&idx, c) in &self.chunks {
            let len = self.size.saturating_sub(idx * CHUNK_BYTES).min(CHUNK_BYTES) as usize;
            h.chunk(idx, &c[..len]);
        }
        h.finish()
    }
}

/// Hash of a file's content that skips zero chunks, so a hole and written zeros hash
/// alike. The recovered file system's reader feeds it chunk by chunk in order.
pub struct ContentHasher(DefaultHasher);

impl ContentHasher {
    pub fn new(size: u64) -> ContentHasher {
        let mut h = DefaultHasher::new();
        size.hash(&mut h);
        ContentHasher(h)
    }
    pub fn chunk(&mut self, idx: u64, bytes: &[u8]) {
        if bytes.iter().any(|&b| b != 0) {
            idx.hash(&mut self.0);
            bytes.hash(&mut self.0);
        }
    }
    pub fn finish(&self) -> u64 {
        self.0.finish()
    }
}

#[derive(Debug, Clone)]
pub enum Body {
    File(FileData),
    Dir(BTreeMap<Vec<u8>, Mid>),
    Symlink(Vec<u8>),
}

#[derive(Debug, Clone)]
pub struct Node {
    pub body: Body,
    /// Permission bits (mode & 0o7777).
    pub perm: u32,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Names of a file or symlink; a directory's is 2 + subdirectories (computed).
    pub links: u32,
    /// A directory's parent (the root's is itself).
    pub parent: Mid,
}

impl Node {
    pub fn kind(&self) -> Kind {
        match self.body {
            Body::File(_) => Kind::File,
            Body::Dir(_) => Kind::Dir,
            Body::Symlink(_) => Kind::Symlink,
        }
    }
}

/// The model file system.
#[derive(Debug, Clone)]
pub struct Model {
    pub nodes: BTreeMap<Mid, Node>,
    pub next_mid: Mid,
}

impl Default for Model {
    fn default() -> Self {
        Self::new()
    }
}

impl Model {
    /// A freshly made file system: an empty root directory, mode 0755 (as mkfs makes it).
    pub fn new() -> Model {
        let root = Node {
            body: Body::Dir(BTreeMap::new()),
            perm: 0o755,
            xattrs: BTreeMap::new(),
            links: 0,
            parent: ROOT,
        };
        Model {
            nodes: BTreeMap::from([(ROOT, root)]),
            next_mid: 1,
        }
    }

    pub fn node(&self, m: Mid) -> &Node {
        self.nodes
            .get(&m)
            .unwrap_or_else(|| panic!("model inode {m} does not exist"))
    }
    pub fn node_mut(&mut self, m: Mid) -> &mut Node {
        self.nodes
            .get_mut(&m)
            .unwrap_or_else(|| panic!("model inode {m} does not exist"))
    }
    pub fn children(&self, dir: Mid) -> &BTreeMap<Vec<u8>, Mid> {
        match &self.node(dir).body {
            Body::Dir(c) => c,
            _ => panic!("model inode {dir} is not a directory"),
        }
    }
    fn children_mut(&mut self, dir: Mid) -> &mut BTreeMap<Vec<u8>, Mid> {
        match &mut self.node_mut(dir).body {
            Body::Dir(c) => c,
            _ => panic!("model inode {dir} is not a directory"),
        }
    }
    pub fn lookup(&self, dir: Mid, name: &[u8]) -> Option<Mid> {
        self.children(dir).get(name).copied()
    }
    pub fn file(&self, m: Mid) -> &FileData {
        match &self.node(m).body {
            Body::File(d) => d,
            _ => panic!("model inode {m} is not a file"),
        }
    }
    fn file_mut(&mut self, m: Mid) -> &mut FileData {
        match &mut self.node_mut(m).body {
            Body::File(d) => d,
            _ => panic!("model inode {m} is not a file"),
        }
    }

    pub fn nlink(&self, m: Mid) -> u32 {
        let n = self.node(m);
        match &n.body {
            Body::Dir(c) => {
                2 + c
                    .values()
                    .filter(|&&x| self.node(x).kind() == Kind::Dir)
                    .count() as u32
            }
            _ => n.links,
        }
    }

    /// Is `m` the directory `dir` or one of its ancestors?
    pub fn is_ancestor_or_self(&self, m: Mid, mut dir: Mid) -> bool {
        loop {
            if dir == m {
                return true;
            }
            if dir == ROOT {
                return false;
            }
            dir = self.node(dir).parent;
        }
    }

    pub fn ids_of(&self, kind: Kind) -> Vec<Mid> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.kind() == kind)
            .map(|(&m, _)| m)
            .collect()
    }

    /// Path of a directory (for messages).
    pub fn dir_path(&self, mut dir: Mid) -> String {
        let mut parts = Vec::new();
        while dir != ROOT {
            let p = self.node(dir).parent;
            let name = self
                .children(p)
                .iter()
                .find(|(_, &c)| c == dir)
                .map(|(n, _)| String::from_utf8_lossy(n).into_owned())
                .unwrap_or_else(|| "?".into());
            parts.push(name);
            dir = p;
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    }

    // ---- mutations (the caller checked they are valid) ---------------------------

    pub fn create(&mut self, parent: Mid, name: &[u8], perm: u32, body: Body) -> Mid {
        let m = self.next_mid;
        self.next_mid += 1;
        let links = if matches!(body, Body::Dir(_)) { 0 } else { 1 };
        self.nodes.insert(
            m,
            Node {
                body,
                perm,
                xattrs: BTreeMap::new(),
                links,
                parent,
            },
        );
        let prev = self.children_mut(parent).insert(name.to_vec(), m);
        assert!(prev.is_none(), "model: create over an existing name");
        m
    }

    pub fn write(&mut self, file: Mid, offset: u64, data: &[u8]) {
        self.file_mut(file).write(offset, data);
    }

    pub fn truncate(&mut self, file: Mid, size: u64) {
        self.file_mut(file).truncate(size);
    }

    /// Drop one name of `m`; the node goes away with its last name.
    fn unref(&mut self, m: Mid) {
        let n = self.node_mut(m);
        if matches!(n.body, Body::Dir(_)) {
            self.nodes.remove(&m);
            return;
        }
        n.links -= 1;
        if n.links == 0 {
            self.nodes.remove(&m);
        }
    }

    pub fn remove(&mut self, parent: Mid, name: &[u8]) {
        let m = self
            .children_mut(parent)
            .remove(name)
            .expect("model: remove of a missing name");
        self.unref(m);
    }

    pub fn link(&mut self, file: Mid, parent: Mid, name: &[u8]) {
        self.node_mut(file).links += 1;
        let prev = self.children_mut(parent).insert(name.to_vec(), file);
        assert!(prev.is_none(), "model: link over an existing name");
    }

    /// rename(2) without flags: replaces a target of the same kind (an empty
    /// directory for a directory); two names of one inode: nothing happens.
    pub fn rename(&mut self, sp: Mid, sn: &[u8], dp: Mid, dn: &[u8]) {
        let src = self
            .lookup(sp, sn)
            .expect("model: rename of a missing name");
        if let Some(dst) = self.lookup(dp, dn) {
            if dst == src {
                return;
            }
            self.children_mut(dp).remove(dn);
            self.unref(dst);
        }
        self.children_mut(sp).remove(sn);
        self.children_mut(dp).insert(dn.to_vec(), src);
        if self.node(src).kind() == Kind::Dir {
            self.node_mut(src).parent = dp;
        }
    }

    pub fn set_xattr(&mut self, m: Mid, name: &[u8], value: &[u8]) {
        self.node_mut(m)
            .xattrs
            .insert(name.to_vec(), value.to_vec());
    }
    pub fn remove_xattr(&mut self, m: Mid, name: &[u8]) {
        self.node_mut(m).xattrs.remove(name);
    }
    pub fn chmod(&mut self, m: Mid, perm: u32) {
        self.node_mut(m).perm = perm;
    }

    /// The canonical form of the namespace and metadata.
    pub fn canon(&self) -> Canon {
        let mut entries = BTreeMap::new();
        let mut names_of: BTreeMap<Mid, Vec<String>> = BTreeMap::new();
        let mut stack = vec![(ROOT, "/".to_string())];
        while let Some((dir, path)) = stack.pop() {
            for (name, &m) in self.children(dir) {
                let p = join(&path, name);
                names_of.entry(m).or_default().push(p.clone());
                if self.node(m).kind() == Kind::Dir {
                    stack.push((m, p));
                }
            }
        }
        let mut add = |path: String, m: Mid, first_name: Option<String>| {
            let n = self.node(m);
            let kind = n.kind();
            let meta = Meta {
                kind,
                mode: kind.type_bits() | n.perm,
                size: match &n.body {
                    Body::File(d) => Some(d.size),
                    Body::Symlink(t) => Some(t.len() as u64),
                    Body::Dir(_) => None,
                },
                nlink: self.nlink(m),
                xattrs: n
                    .xattrs
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                target: match &n.body {
                    Body::Symlink(t) => Some(t.clone()),
                    _ => None,
                },
                first_name,
            };
            entries.insert(path, Entry { meta, mid: m });
        };
        add("/".to_string(), ROOT, None);
        for (m, mut paths) in names_of {
            paths.sort();
            let first = (paths.len() > 1).then(|| paths[0].clone());
            for p in paths {
                add(p, m, first.clone());
            }
        }
        Canon::new(entries)
    }
}

pub fn join(dir: &str, name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// What the check compares for one name: everything but inode numbers, timestamps,
/// directory sizes and allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Meta {
    pub kind: Kind,
    /// Type and permission bits.
    pub mode: u32,
    /// Files: bytes; symlinks: target length; directories: not compared.
    pub size: Option<u64>,
    pub nlink: u32,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    pub target: Option<Vec<u8>>,
    /// For an inode with several names: its smallest path (which names share an inode).
    pub first_name: Option<String>,
}

impl fmt::Display for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} mode {:o} nlink {}", self.kind, self.mode, self.nlink)?;
        if let Some(s) = self.size {
            write!(f, " size {s}")?;
        }
        if !self.xattrs.is_empty() {
            let names: Vec<String> = self
                .xattrs
                .iter()
                .map(|(k, v)| format!("{}({}B)", String::from_utf8_lossy(k), v.len()))
                .collect();
            write!(f, " xattrs [{}]", names.join(" "))?;
        }
        if let Some(t) = &self.target {
            write!(f, " -> {:?}", trunc(&String::from_utf8_lossy(t), 40))?;
        }
        if let Some(n) = &self.first_name {
            write!(f, " (hard link of {n})")?;
        }
        Ok(())
    }
}

pub fn trunc(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        format!("{}…({} bytes)", &s[..n], s.len())
    }
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub meta: Meta,
    /// The model inode (model side) or the inode number (recovered side); never
    /// compared.
    pub mid: Mid,
}

/// A namespace in canonical form: path -> metadata, with a hash for quick matching.
#[derive(Debug, Clone)]
pub struct Canon {
    pub entries: BTreeMap<String, Entry>,
    pub hash: u64,
}

impl Canon {
    pub fn new(entries: BTreeMap<String, Entry>) -> Canon {
        let mut h = DefaultHasher::new();
        for (p, e) in &entries {
            p.hash(&mut h);
            e.meta.hash(&mut h);
        }
        Canon {
            hash: h.finish(),
            entries,
        }
    }

    pub fn same_as(&self, other: &Canon) -> bool {
        self.hash == other.hash
            && self.entries.len() == other.entries.len()
            && self
                .entries
                .iter()
                .zip(&other.entries)
                .all(|(a, b)| a.0 == b.0 && a.1.meta == b.1.meta)
    }

    /// Differences from `expected` to `self` (found), one line each, in path order.
    pub fn diff(&self, expected: &Canon) -> Vec<Divergence> {
        let paths: BTreeSet<&String> = self.entries.keys().chain(expected.entries.keys()).collect();
        let mut out = Vec::new();
        for p in paths {
            match (expected.entries.get(p), self.entries.get(p)) {
                (Some(e), None) => out.push(Divergence {
                    path: p.clone(),
                    what: DivergenceKind::Missing,
                    detail: format!("{p}: missing; expected {}", e.meta),
                }),
                (None, Some(f)) => out.push(Divergence {
                    path: p.clone(),
                    what: DivergenceKind::Unexpected,
                    detail: format!("{p}: unexpected {}", f.meta),
                }),
                (Some(e), Some(f)) if e.meta != f.meta => {
                    let (e, f) = (&e.meta, &f.meta);
                    let mut parts = Vec::new();
                    if e.kind != f.kind {
                        parts.push(format!("kind {} expected, {} found", e.kind, f.kind));
                    } else if e.mode != f.mode {
                        parts.push(format!("mode {:o} expected, {:o} found", e.mode, f.mode));
                    }
                    if e.size != f.size {
                        parts.push(format!("size {:?} expected, {:?} found", e.size, f.size));
                    }
                    if e.nlink != f.nlink {
                        parts.push(format!("nlink {} expected, {} found", e.nlink, f.nlink));
                    }
                    if e.xattrs != f.xattrs {
                        parts.push(format!(
                            "xattrs differ: expected {:?}, found {:?}",
                            xattr_summary(&e.xattrs),
                            xattr_summary(&f.xattrs)
                        ));
                    }
                    if e.target != f.target {
                        parts.push("symlink target differs".to_string());
                    }
                    if e.first_name != f.first_name {
                        parts.push(format!(
                            "hard-link group: expected {:?}, found {:?}",
                            e.first_name, f.first_name
                        ));
                    }
                    out.push(Divergence {
                        path: p.clone(),
                        what: DivergenceKind::Differs,
                        detail: format!("{p}: {}", parts.join("; ")),
                    });
                }
                _ => {}
            }
        }
        out
    }
}

fn xattr_summary(x: &[(Vec<u8>, Vec<u8>)]) -> Vec<String> {
    x.iter()
        .map(|(k, v)| {
            format!(
                "{}={}B#{:04x}",
                String::from_utf8_lossy(k),
                v.len(),
                v.iter().fold(0u16, |a, &b| a.rotate_left(3) ^ b as u16)
            )
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DivergenceKind {
    Missing,
    Unexpected,
    Differs,
}

#[derive(Debug, Clone)]
pub struct Divergence {
    pub path: String,
    pub what: DivergenceKind,
    pub detail: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_data_write_truncate_read_and_hash() {
        let mut d = FileData::default();
        d.write(100, &[1u8; 200_000]);
        assert_eq!(d.size, 200_100);
        assert_eq!(d.read(99, 3), vec![0, 1, 1]);
        d.truncate(150);
        assert_eq!(d.read(140, 20), [vec![1u8; 10], vec![0u8; 10]].concat());
        d.truncate(300_000);
        assert_eq!(
            d.read(149, 2),
            vec![1, 0],
            "bytes past an old end read zero"
        );
        let mut e = FileData::default();
        e.write(100, &[1u8; 50]);
        e.truncate(300_000);
        assert_eq!(
            d.content_hash(),
            e.content_hash(),
            "same content, same hash, whatever the history"
        );
        e.write(299_999, &[0u8; 1]);
        assert_eq!(
            d.content_hash(),
            e.content_hash(),
            "written zeros hash like a hole"
        );
        e.write(0, &[2]);
        assert_ne!(d.content_hash(), e.content_hash());
    }
}
