//! Checks of a recovered file system: a structural walk through the `FileSystem` API
//! (readdir, lookup, getattr, readlink, getxattr, read to the end of every file, link
//! counts, inode and block allocation against what the tree uses), its canonical form,
//! and the match against the states the crash allowed.

use super::model::{
    join, Canon, ContentHasher, DivergenceKind, Entry, Kind, Meta, Mid, CHUNK_BYTES,
};
use super::workload::Plan;
use mako_disk::Disk;
use mako_fs::fs::{dtype, FileSystem, ROOT_INO};
use mako_fs::FsError;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

/// Inodes below this number are the file system's own (mkfs marks them in use).
pub const FIRST_USER_INO: u64 = mako_fs::mkfs::FIRST_USER_INO;

/// One thing wrong, with a kind for the summary (what went wrong, without paths or
/// numbers) and the detail (where, what exactly).
#[derive(Debug, Clone)]
pub struct Violation {
    pub kind: String,
    pub detail: String,
}

impl Violation {
    pub fn new(kind: impl Into<String>, detail: impl Into<String>) -> Violation {
        Violation {
            kind: kind.into(),
            detail: detail.into(),
        }
    }
}

/// What `mako fsck` says about a set of disks.
#[derive(Debug)]
pub enum FsckVerdict {
    Clean,
    Damaged(String),
}

/// `mako fsck -n` on the crashed disks before they are mounted: it reads them with
/// the recovery log laid over (as the mount's replay will write them), so anything it
/// finds besides the unclean stop itself (`log_replay`: committed transactions not in
/// place, a torn last one) is damage the log did not cover.
///
/// A check costs about 60 ms here; `MAKO_CRASH_FSCK_EVERY=N` (default 3) runs it on
/// every Nth recovered image (1: all of them) to keep the suite's time in bounds.
pub fn fsck_clean(disks: &[Arc<dyn Disk>]) -> FsckVerdict {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let every = std::env::var("MAKO_CRASH_FSCK_EVERY")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(3)
        .max(1);
    if !CALLS
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .is_multiple_of(every)
    {
        return FsckVerdict::Clean;
    }
    let opts = mako_fsck::Options::check().threads(1);
    match mako_fsck::check_offline(disks.to_vec(), &opts, &mako_fsck::NoProgress) {
        Ok(r) => {
            let bad: Vec<String> = r
                .problems
                .iter()
                .filter(|p| p.kind != mako_fsck::ProblemKind::LogReplay)
                // A crash during a descriptor update leaves the copies not yet written one
                // generation behind; the mount takes the newest and rewrites them all.
                .filter(|p| {
                    !(p.kind == mako_fsck::ProblemKind::DescriptorCopy
                        && p.what.contains("is stale"))
                })
                .map(|p| format!("[{}] {}", p.kind.name(), p.what))
                .collect();
            if bad.is_empty() {
                FsckVerdict::Clean
            } else {
                FsckVerdict::Damaged(bad.join("; "))
            }
        }
        Err(e) => FsckVerdict::Damaged(format!("fsck could not run: {e}")),
    }
}

/// The kind of a walk error, from the file system's error.
fn error_kind(e: &FsError) -> &'static str {
    match e {
        FsError::Stale(_) => "directory entry points at a free or unlinked inode",
        FsError::Corrupt(_) => "bad metadata (checksum, identity or encoding)",
        FsError::Integrity(_) => {
            "metadata that passed its checks but is impossible (integrity failure)"
        }
        FsError::Invalid(_) => "invalid metadata",
        FsError::Disk(_) => "disk error during the walk",
        FsError::NotFound(_) => "readdir lists a name that lookup cannot find",
        _ => "unexpected error during the walk",
    }
}

/// A file as read back.
#[derive(Debug, Clone)]
pub struct FileSeen {
    pub hash: u64,
}

/// The recovered file system as the walk saw it.
pub struct Found {
    /// Canonical form; `Entry::mid` holds the inode number.
    pub canon: Canon,
    pub files: BTreeMap<u64, FileSeen>,
}

struct InodeSeen {
    attr: mako_fs::Attr,
    kind: Kind,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    target: Option<Vec<u8>>,
    subdirs: u32,
}

/// Walk the whole tree, recording every problem in `v`. Returns what it saw (a damaged
/// part of the tree is left out of the canonical form).
pub fn walk(fs: &FileSystem, v: &mut Vec<Violation>) -> Found {
    let mut inodes: BTreeMap<u64, InodeSeen> = BTreeMap::new();
    let mut names_of: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut files = BTreeMap::new();
    let root = match fs.getattr(ROOT_INO) {
        Ok(a) => a,
        Err(e) => {
            v.push(Violation::new(
                error_kind(&e),
                format!("getattr of the root directory: {e}"),
            ));
            return Found {
                canon: Canon::new(BTreeMap::new()),
                files,
            };
        }
    };
    if let Some(seen) = inode_info(fs, "/", root, v, &mut files) {
        inodes.insert(ROOT_INO, seen);
    }
    let mut visited = HashSet::from([ROOT_INO]);
    let mut stack = vec![(ROOT_INO, "/".to_string(), ROOT_INO)];
    while let Some((dir, path, parent)) = stack.pop() {
        let Some(entries) = list_dir(fs, dir, &path, parent, v) else {
            continue;
        };
        for e in entries {
            let p = join(&path, &e.name);
            let attr = match fs.lookup(dir, &e.name) {
                Ok(a) => a,
                Err(err) => {
                    v.push(Violation::new(
                        error_kind(&err),
                        format!("lookup {p} (readdir: inode {}): {err}", e.ino),
                    ));
                    continue;
                }
            };
            if attr.ino != e.ino {
                v.push(Violation::new(
                    "readdir and lookup disagree",
                    format!(
                        "{p}: readdir says inode {}, lookup says {}",
                        e.ino, attr.ino
                    ),
                ));
            }
            if dtype(attr.mode) != e.kind {
                v.push(Violation::new(
                    "entry type differs from the inode's",
                    format!("{p}: entry type {}, inode mode {:o}", e.kind, attr.mode),
                ));
            }
            let ino = attr.ino;
            if let std::collections::btree_map::Entry::Vacant(slot) = inodes.entry(ino) {
                match inode_info(fs, &p, attr.clone(), v, &mut files) {
                    Some(seen) => {
                        slot.insert(seen);
                    }
                    None => continue,
                }
            }
            names_of.entry(ino).or_default().push(p.clone());
            if inodes[&ino].kind == Kind::Dir {
                if let Some(d) = inodes.get_mut(&dir) {
                    d.subdirs += 1;
                }
                if visited.insert(ino) {
                    stack.push((ino, p, dir));
                } else {
                    v.push(Violation::new(
                        "directory reached by two names (hard link or cycle)",
                        format!(
                            "{p}: directory inode {ino} seen before at {:?}",
                            names_of[&ino]
                        ),
                    ));
                }
            }
        }
    }
    // Link counts.
    for (&ino, seen) in &inodes {
        let names = names_of.get(&ino).map(|n| n.len()).unwrap_or(0);
        let where_ = names_of
            .get(&ino)
            .and_then(|n| n.first())
            .cloned()
            .unwrap_or_else(|| "/".into());
        match seen.kind {
            Kind::Dir if seen.attr.nlink != 2 + seen.subdirs => v.push(Violation::new(
                "directory nlink is not 2 + subdirectories",
                format!(
                    "{where_} (inode {ino}): nlink {}, {} subdirectories",
                    seen.attr.nlink, seen.subdirs
                ),
            )),
            Kind::File | Kind::Symlink if seen.attr.nlink as usize != names => {
                v.push(Violation::new(
                    "file nlink differs from the names found",
                    format!(
                        "{where_} (inode {ino}): nlink {}, {names} names {:?}",
                        seen.attr.nlink,
                        names_of.get(&ino)
                    ),
                ))
            }
            _ => {}
        }
    }
    check_allocation(fs, &inodes, &names_of, v);
    // The canonical form.
    let mut entries = BTreeMap::new();
    let meta_of = |seen: &InodeSeen, first_name: Option<String>| Meta {
        kind: seen.kind,
        mode: seen.attr.mode,
        size: (seen.kind != Kind::Dir).then_some(seen.attr.size),
        nlink: seen.attr.nlink,
        xattrs: seen.xattrs.clone(),
        target: seen.target.clone(),
        first_name,
    };
    if let Some(r) = inodes.get(&ROOT_INO) {
        entries.insert(
            "/".to_string(),
            Entry {
                meta: meta_of(r, None),
                mid: ROOT_INO,
            },
        );
    }
    for (ino, mut paths) in names_of {
        paths.sort();
        let first = (paths.len() > 1).then(|| paths[0].clone());
        for p in paths {
            entries.insert(
                p,
                Entry {
                    meta: meta_of(&inodes[&ino], first.clone()),
                    mid: ino,
                },
            );
        }
    }
    Found {
        canon: Canon::new(entries),
        files,
    }
}

/// Every entry of a directory but `.` and `..`, which are checked here.
fn list_dir(
    fs: &FileSystem,
    dir: u64,
    path: &str,
    parent: u64,
    v: &mut Vec<Violation>,
) -> Option<Vec<mako_fs::fs::DirListing>> {
    let mut out = Vec::new();
    let mut names = HashSet::new();
    let mut after = 0u64;
    loop {
        let batch = match fs.readdir(dir, after, 128) {
            Ok(b) => b,
            Err(e) => {
                v.push(Violation::new(
                    error_kind(&e),
                    format!("readdir {path} (inode {dir}) after cookie {after}: {e}"),
                ));
                return None;
            }
        };
        let Some(last) = batch.last() else { break };
        if last.cookie <= after {
            v.push(Violation::new(
                "readdir cookie does not advance",
                format!("readdir {path}: cookie {} after {after}", last.cookie),
            ));
            return None;
        }
        after = last.cookie;
        for e in batch {
            match e.name.as_slice() {
                b"." if e.ino != dir => v.push(Violation::new(
                    "bad . entry",
                    format!("{path}: . is inode {}, not {dir}", e.ino),
                )),
                b".." if e.ino != parent => v.push(Violation::new(
                    "bad .. entry",
                    format!("{path}: .. is inode {}, not {parent}", e.ino),
                )),
                b"." | b".." => {}
                _ => {
                    if !names.insert(e.name.clone()) {
                        v.push(Violation::new(
                            "duplicate name in a directory",
                            format!("{}: listed twice", join(path, &e.name)),
                        ));
                        continue;
                    }
                    out.push(e);
                }
            }
        }
        if out.len() > 1_000_000 {
            v.push(Violation::new(
                "readdir does not end",
                format!("readdir {path}: more than a million entries"),
            ));
            return None;
        }
    }
    Some(out)
}

/// Attributes, xattrs, symlink target and content of one inode.
fn inode_info(
    fs: &FileSystem,
    path: &str,
    attr: mako_fs::Attr,
    v: &mut Vec<Violation>,
    files: &mut BTreeMap<u64, FileSeen>,
) -> Option<InodeSeen> {
    let ino = attr.ino;
    let Some(kind) = Kind::from_mode(attr.mode) else {
        v.push(Violation::new(
            "unexpected file type",
            format!("{path} (inode {ino}): mode {:o}", attr.mode),
        ));
        return None;
    };
    let mut xattrs = Vec::new();
    match fs.listxattr(ino) {
        Ok(list) => {
            for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
                match fs.getxattr(ino, name) {
                    Ok(val) => xattrs.push((name.to_vec(), val)),
                    Err(e) => v.push(Violation::new(
                        "listed xattr unreadable",
                        format!("{path}: getxattr {}: {e}", String::from_utf8_lossy(name)),
                    )),
                }
            }
        }
        Err(e) => v.push(Violation::new(
            error_kind(&e),
            format!("listxattr {path}: {e}"),
        )),
    }
    xattrs.sort();
    let mut target = None;
    match kind {
        Kind::Symlink => match fs.readlink(ino) {
            Ok(t) if t.len() as u64 == attr.size => target = Some(t),
            Ok(t) => v.push(Violation::new(
                "symlink target length differs from its size",
                format!("{path}: {} bytes, size {}", t.len(), attr.size),
            )),
            Err(e) => v.push(Violation::new(
                error_kind(&e),
                format!("readlink {path}: {e}"),
            )),
        },
        Kind::File => match read_file(fs, ino, attr.size) {
            Ok(seen) => {
                files.insert(ino, seen);
            }
            Err(e) => v.push(Violation::new(
                e.0,
                format!("{path} (inode {ino}, size {}): {}", attr.size, e.1),
            )),
        },
        Kind::Dir => {}
    }
    Some(InodeSeen {
        attr,
        kind,
        xattrs,
        target,
        subdirs: 0,
    })
}

/// Read a file to its end (and a little past it) and hash its content.
fn read_file(fs: &FileSystem, ino: u64, size: u64) -> Result<FileSeen, (&'static str, String)> {
    let mut h = ContentHasher::new(size);
    let mut off = 0u64;
    let mut idx = 0u64;
    while off < size {
        let want = (size - off).min(CHUNK_BYTES);
        let data = fs
            .read(ino, off, want as u32)
            .map_err(|e| (error_kind(&e), format!("read at {off}+{want}: {e}")))?;
        if data.len() as u64 != want {
            return Err((
                "short read inside the file",
                format!("read at {off}+{want} returned {} bytes", data.len()),
            ));
        }
        h.chunk(idx, &data);
        off += want;
        idx += 1;
    }
    let past = fs
        .read(ino, size, 4096)
        .map_err(|e| (error_kind(&e), format!("read at the end ({size}): {e}")))?;
    if !past.is_empty() {
        return Err((
            "read past the end returns data",
            format!("read at {size} returned {} bytes", past.len()),
        ));
    }
    Ok(FileSeen { hash: h.finish() })
}

/// The bytes of a file and of the model differ first where? (for reports)
pub fn first_difference(fs: &FileSystem, ino: u64, model: &super::model::FileData) -> String {
    let mut off = 0u64;
    while off < model.size {
        let want = (model.size - off).min(CHUNK_BYTES);
        let got = match fs.read(ino, off, want as u32) {
            Ok(g) => g,
            Err(e) => return format!("read at {off} fails: {e}"),
        };
        let exp = model.read(off, want as usize);
        if let Some(i) = (0..want as usize).find(|&i| got.get(i) != exp.get(i)) {
            let found_zero = got[i..].iter().take_while(|&&b| b == 0).count();
            return format!(
                "first difference at byte {} (expected {:#04x}, found {}){}",
                off + i as u64,
                exp[i],
                got.get(i)
                    .map(|b| format!("{b:#04x}"))
                    .unwrap_or_else(|| "end of data".into()),
                if found_zero > 0 {
                    format!("; {found_zero} zero bytes from there in that chunk")
                } else {
                    String::new()
                }
            );
        }
        off += want;
    }
    "no difference in the bytes read now (the walk saw different bytes)".into()
}

/// Inode and block allocation against the tree: every reachable inode is in use in the
/// inode map, no more inodes are in use than are reachable, every block of a reachable
/// inode is in use in the allocation map, and no two inodes share a subblock.
fn check_allocation(
    fs: &FileSystem,
    inodes: &BTreeMap<u64, InodeSeen>,
    names_of: &BTreeMap<u64, Vec<String>>,
    v: &mut Vec<Violation>,
) {
    let core = &fs.core;
    let name = |ino: u64| {
        names_of
            .get(&ino)
            .and_then(|n| n.first())
            .cloned()
            .unwrap_or_else(|| "/".into())
    };
    let sf = fs.statfs();
    if sf.blocks_free > sf.blocks || sf.files_free > sf.files {
        v.push(Violation::new(
            "statfs: more free than total",
            format!("{sf:?}"),
        ));
    }
    let user_reachable = inodes.keys().filter(|&&i| i >= FIRST_USER_INO).count() as u64;
    let in_use = sf.files - sf.files_free;
    for &ino in inodes.keys() {
        if !core.imap.is_used(ino) {
            v.push(Violation::new(
                "reachable inode is free in the inode map",
                format!("{} (inode {ino})", name(ino)),
            ));
        }
    }
    if in_use > FIRST_USER_INO + user_reachable {
        v.push(Violation::new(
            "inode leak: inodes in use that no name reaches",
            format!(
                "{in_use} inodes in use, {FIRST_USER_INO} reserved + {user_reachable} reachable"
            ),
        ));
    }
    let sectors_per_subblock = core.geo.sectors_per_subblock();
    let mut extents: Vec<(u32, u64, u64, u64)> = Vec::new(); // disk, first sector, sectors, inode
    let mut user_subblocks = 0u64;
    for &ino in inodes.keys() {
        let units = match fs.block_list(ino) {
            Ok(u) => u,
            Err(e) => {
                v.push(Violation::new(
                    error_kind(&e),
                    format!("block list of {} (inode {ino}): {e}", name(ino)),
                ));
                continue;
            }
        };
        let h = match core.get(ino) {
            Ok(h) => h,
            Err(e) => {
                v.push(Violation::new(
                    error_kind(&e),
                    format!("inode {ino} ({}): {e}", name(ino)),
                ));
                continue;
            }
        };
        let st = h.state.read();
        user_subblocks += st.inode.subblocks;
        for (unit, da) in units {
            let n = mako_fs::block_map::allocated_subblocks(core, &st, unit);
            match core.alloc.is_used(da, n) {
                Ok(true) => {}
                Ok(false) => v.push(Violation::new(
                    "block of a reachable inode is free in the allocation map",
                    format!(
                        "{} (inode {ino}) unit {unit} at {da} ({n} subblocks)",
                        name(ino)
                    ),
                )),
                Err(e) => v.push(Violation::new(
                    "block pointer outside the allocatable area",
                    format!("{} (inode {ino}) unit {unit}: {e}", name(ino)),
                )),
            }
            extents.push((da.disk(), da.sector(), n as u64 * sectors_per_subblock, ino));
        }
    }
    extents.sort();
    for w in extents.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a.0 == b.0 && b.1 < a.1 + a.2 {
            v.push(Violation::new(
                "two inodes share disk space",
                format!(
                    "{} (inode {}) and {} (inode {}) overlap at disk {} sector {}",
                    name(a.3),
                    a.3,
                    name(b.3),
                    b.3,
                    b.0,
                    b.1
                ),
            ));
        }
    }
    // Subblocks in use beyond what reachable inodes and the system files account for
    // are leaked space; fewer mean a reachable block is free (reported above).
    // This node's recovery log: its inode lives in the log table, with a number of its own.
    let system: u64 = (0..FIRST_USER_INO)
        .chain(std::iter::once(mako_format::log_table::log_ino(core.node)))
        .filter_map(|i| core.cached_handle(i))
        .filter(|h| !inodes.contains_key(&h.ino))
        .map(|h| h.state.read().inode.subblocks)
        .sum();
    let used = core.alloc.total_subblocks() - core.alloc.free_subblocks();
    if used > system + user_subblocks {
        v.push(Violation::new(
            "block leak: subblocks in use that no inode accounts for",
            format!("{used} subblocks in use, {system} by system files + {user_subblocks} by reachable inodes"),
        ));
    }
}

/// What the crash allowed: a state in `first..=last` of `plan`, and the content of the
/// files not in `dirty` (made durable and unchanged since).
pub struct Allowed<'a> {
    pub plan: &'a Plan,
    pub first: usize,
    pub last: usize,
    pub dirty: &'a BTreeSet<Mid>,
}

/// Match the recovered namespace against the allowed states; returns the matched state.
pub fn match_state(
    fs: &FileSystem,
    found: &Found,
    allowed: &Allowed,
    v: &mut Vec<Violation>,
) -> Option<usize> {
    let plan = allowed.plan;
    let mut content_failures: Option<(usize, Vec<Violation>)> = None;
    for j in (allowed.first..=allowed.last).rev() {
        if !plan.canons[j].same_as(&found.canon) {
            continue;
        }
        let bad = check_content(fs, found, allowed, j);
        if bad.is_empty() {
            return Some(j);
        }
        if content_failures
            .as_ref()
            .is_none_or(|(_, b)| bad.len() < b.len())
        {
            content_failures = Some((j, bad));
        }
    }
    if let Some((j, bad)) = content_failures {
        for mut b in bad {
            b.detail = format!("{} (namespace matches state {j})", b.detail);
            v.push(b);
        }
        return None;
    }
    // No state matches: report against the nearest one.
    let (j, diffs) = (allowed.first..=allowed.last)
        .rev()
        .map(|j| (j, found.canon.diff(&plan.canons[j])))
        .min_by_key(|(_, d)| d.len())
        .expect("at least one allowed state");
    let first = &diffs[0];
    let in_all =
        |p: &str| (allowed.first..=allowed.last).all(|k| plan.canons[k].entries.contains_key(p));
    let in_none =
        |p: &str| (allowed.first..=allowed.last).all(|k| !plan.canons[k].entries.contains_key(p));
    let kind = match first.what {
        DivergenceKind::Missing if in_all(&first.path) => {
            let e = &plan.canons[j].entries[&first.path];
            let fsynced = e.meta.kind == Kind::File && !allowed.dirty.contains(&e.mid);
            format!(
                "namespace: durable {} missing{}",
                e.meta.kind,
                if fsynced {
                    " (its content was fsynced too)"
                } else {
                    ""
                }
            )
        }
        DivergenceKind::Missing => "namespace: name missing".to_string(),
        DivergenceKind::Unexpected if in_none(&first.path) => {
            "namespace: name present that no allowed state has".to_string()
        }
        DivergenceKind::Unexpected => "namespace: unexpected name".to_string(),
        DivergenceKind::Differs => {
            let fields: Vec<&str> = [
                "kind",
                "mode",
                "size",
                "nlink",
                "xattrs",
                "symlink target",
                "hard-link group",
            ]
            .into_iter()
            .filter(|f| {
                first.detail.contains(&format!("{f} ")) || first.detail.contains(&format!("{f}:"))
            })
            .collect();
            format!(
                "namespace: {} differs from every allowed state",
                fields.join("+")
            )
        }
    };
    let shown: Vec<&str> = diffs.iter().take(8).map(|d| d.detail.as_str()).collect();
    v.push(Violation::new(
        kind,
        format!(
            "no allowed state (states {}..={}) matches; nearest is state {j} with {} differences:\n      {}{}",
            allowed.first,
            allowed.last,
            diffs.len(),
            shown.join("\n      "),
            if diffs.len() > shown.len() { "\n      …" } else { "" }
        ),
    ));
    None
}

/// Durable files of state `j` whose recovered content differs.
fn check_content(fs: &FileSystem, found: &Found, allowed: &Allowed, j: usize) -> Vec<Violation> {
    let model = &allowed.plan.models[j];
    let mut checked = HashSet::new();
    let mut bad = Vec::new();
    for (path, e) in &allowed.plan.canons[j].entries {
        if e.meta.kind != Kind::File || allowed.dirty.contains(&e.mid) || !checked.insert(e.mid) {
            continue;
        }
        let Some(ino) = found.canon.entries.get(path).map(|f| f.mid) else {
            continue;
        };
        let data = model.file(e.mid);
        match found.files.get(&ino) {
            Some(seen) if seen.hash == data.content_hash() => {}
            Some(_) => bad.push(Violation::new(
                "durable file content differs",
                format!(
                    "{path} (inode {ino}, size {}): {}",
                    data.size,
                    first_difference(fs, ino, data)
                ),
            )),
            None => bad.push(Violation::new(
                "durable file content unreadable",
                format!("{path} (inode {ino})"),
            )),
        }
    }
    bad
}
