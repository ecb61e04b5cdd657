//! The fourth phase: the namespace. From every readable directory entry it decides
//! which entries stay (an entry must name a live inode of the type it says; a
//! directory has one name), what the root reaches, what is orphaned (reconnected
//! under /lost+found, created if missing) or unlinked (freed), and what every link
//! count and `..` must be. The outcome is a plan; nothing is written here.

use crate::layout::{dtype, kind_name, Layout, S_IFDIR};
use crate::problem::{Problem, ProblemKind};
use crate::progress::{Phase, Progress};
use crate::scan::{find, InodeRec, SlotState};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Name of the directory orphans are reconnected under, in the root.
pub const LOST_FOUND: &[u8] = b"lost+found";
/// Mode of a /lost+found fsck creates (as e2fsck: owner only).
pub const LOST_FOUND_MODE: u32 = S_IFDIR | 0o700;

/// An entry of a directory fsck rewrites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: u8,
}

/// What the namespace needs changed.
#[derive(Debug, Default)]
pub struct NsPlan {
    /// Directories to rewrite, with their final entries.
    pub dirs: BTreeMap<u64, Vec<NewEntry>>,
    /// New link counts.
    pub nlink: BTreeMap<u64, u32>,
    /// New parents (`..`).
    pub parent: BTreeMap<u64, u64>,
    /// Unlinked inodes to free.
    pub free: Vec<u64>,
    /// Damaged inodes to clear.
    pub clear: Vec<u64>,
    /// The root directory is damaged: recreate it (empty but for what fsck adds).
    pub recreate_root: bool,
    /// /lost+found to create, with this inode number.
    pub create_lost_found: Option<u64>,
    /// The inode file grows by a block to hold the new /lost+found.
    pub grow_inode_file: bool,
    /// Every entry read, with what stays (for paths).
    ents: Vec<Ent>,
    /// Kept entries by the inode they name.
    by_target: Vec<usize>,
    root: u64,
}

#[derive(Debug)]
struct Ent {
    dir: u64,
    name: Vec<u8>,
    ino: u64,
    kind: u8,
    keep: bool,
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// Plan the namespace repairs. `slots` bounds the inode numbers that can hold an inode.
pub fn plan(
    l: &Layout,
    recs: &mut [InodeRec],
    slots: u64,
    problems: &mut Vec<Problem>,
    progress: &dyn Progress,
) -> NsPlan {
    let m = l.desc.metadata_inodes;
    let root = m.root_dir;
    let mut plan = NsPlan::default();
    let rec = |recs: &[InodeRec], ino: u64| find(recs, ino);
    // 1. The root must be a live directory.
    let root_ok = rec(recs, root).is_some_and(|i| recs[i].live() && recs[i].is_dir());
    if !root_ok {
        let why = match rec(recs, root) {
            None => "is blank".to_string(),
            Some(i) if recs[i].state == SlotState::Bad => format!(
                "is damaged: {}",
                recs[i].bad_reason().unwrap_or("unreadable")
            ),
            Some(i) => format!("is a {}", kind_name(recs[i].mode)),
        };
        problems.push(
            Problem::new(
                ProblemKind::MetadataFile,
                format!("the root directory (inode {root}) {why}"),
                "recreate it empty; everything it held is reconnected under /lost+found",
            )
            .ino(root),
        );
        plan.recreate_root = true;
    }
    // 2. Every entry of every live directory.
    let mut ents: Vec<Ent> = Vec::new();
    let mut range: HashMap<u64, (usize, usize)> = HashMap::new();
    let mut changed: BTreeSet<u64> = BTreeSet::new();
    for r in recs.iter_mut() {
        if !r.live() || !r.is_dir() || r.system || (r.ino == root && !root_ok) {
            continue;
        }
        let dir = r.ino;
        let Some(scan) = r.extra.as_mut().and_then(|e| e.dir.as_mut()) else {
            continue;
        };
        if scan.rebuild {
            changed.insert(dir);
        }
        let start = ents.len();
        for e in std::mem::take(&mut scan.entries) {
            ents.push(Ent {
                dir,
                name: e.name,
                ino: e.ino,
                kind: e.kind,
                keep: true,
            });
        }
        range.insert(dir, (start, ents.len()));
    }
    progress.update(Phase::Namespace, 0, ents.len() as u64);
    // 3. What each entry names.
    for e in ents.iter_mut() {
        let t = e.ino;
        let invalid = if t == root {
            Some("the root directory, which has no name".to_string())
        } else if t < m.first_user_inode {
            Some("a metadata file".to_string())
        } else if t >= l.desc.inodes_max || t >= slots {
            Some(format!(
                "beyond the {} inodes the file system has",
                slots.min(l.desc.inodes_max)
            ))
        } else if t == e.dir {
            Some("its own directory".to_string())
        } else {
            None
        };
        let verdict = match invalid {
            Some(what) => Some((
                ProblemKind::EntryToBadInode,
                format!("names inode {t}, {what}"),
            )),
            None => match rec(recs, t) {
                None => Some((
                    ProblemKind::EntryToFreeInode,
                    format!("names inode {t}, which is free"),
                )),
                Some(i) if recs[i].state == SlotState::Bad => Some((
                    ProblemKind::EntryToBadInode,
                    format!(
                        "names inode {t}, which is damaged ({}) and cleared",
                        recs[i].bad_reason().unwrap_or("unreadable")
                    ),
                )),
                Some(i) => {
                    let want = recs[i].dtype();
                    if e.kind != want {
                        problems.push(
                            Problem::new(
                                ProblemKind::EntryType,
                                format!(
                                    "entry {:?} says type {}, inode {t} is a {}",
                                    show(&e.name),
                                    e.kind,
                                    kind_name(recs[i].mode)
                                ),
                                format!("set the entry's type to {want}"),
                            )
                            .ino(e.dir),
                        );
                        e.kind = want;
                        changed.insert(e.dir);
                    }
                    None
                }
            },
        };
        if let Some((kind, what)) = verdict {
            problems.push(
                Problem::new(
                    kind,
                    format!("entry {:?} {what}", show(&e.name)),
                    "remove the entry",
                )
                .ino(e.dir),
            );
            e.keep = false;
            changed.insert(e.dir);
        }
    }
    // 4. A directory keeps one name: the one in its parent, else the first.
    let mut by_target: Vec<usize> = (0..ents.len()).filter(|&i| ents[i].keep).collect();
    by_target.sort_by_key(|&i| (ents[i].ino, ents[i].dir, i));
    let mut k = 0;
    while k < by_target.len() {
        let t = ents[by_target[k]].ino;
        let mut j = k;
        while j < by_target.len() && ents[by_target[j]].ino == t {
            j += 1;
        }
        let ri = rec(recs, t).expect("kept entries name live inodes");
        if recs[ri].is_dir() && j - k > 1 {
            let parent = recs[ri].parent;
            let keep = (k..j)
                .find(|&x| ents[by_target[x]].dir == parent)
                .unwrap_or(k);
            for x in (k..j).filter(|&x| x != keep) {
                let e = &mut ents[by_target[x]];
                problems.push(
                    Problem::new(
                        ProblemKind::DirectoryHardLink,
                        format!(
                            "directory inode {t} has a second name {:?} in directory {}",
                            show(&e.name),
                            e.dir
                        ),
                        "remove the second name",
                    )
                    .ino(t),
                );
                e.keep = false;
                changed.insert(e.dir);
            }
        }
        k = j;
    }
    by_target.retain(|&i| ents[i].keep);
    // 5. What the root reaches.
    // Inode numbers may be sparse up to 2^50 (each node hands out numbers from its own
    // inode-map segments), so these are sets, not tables indexed by number.
    let mut reached: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let children = |d: u64| range.get(&d).copied().unwrap_or((0, 0));
    let walk_from = |start: u64,
                     reached: &mut std::collections::HashSet<u64>,
                     ents: &[Ent],
                     recs: &[InodeRec]| {
        reached.insert(start);
        let mut queue = vec![start];
        while let Some(d) = queue.pop() {
            let (a, b) = children(d);
            for e in &ents[a..b] {
                if e.keep
                    && reached.insert(e.ino)
                    && rec(recs, e.ino).is_some_and(|i| recs[i].is_dir())
                {
                    queue.push(e.ino);
                }
            }
        }
    };
    if root_ok {
        walk_from(root, &mut reached, &ents, recs);
    } else {
        reached.insert(root);
    }
    progress.update(Phase::Namespace, ents.len() as u64 / 2, ents.len() as u64);
    // 6. Names each inode keeps. Unlinked inodes without a name are freed; the
    //    entries of a freed directory go with it (which may free more).
    let mut names: HashMap<u64, u32> = HashMap::new();
    let mut freed: BTreeSet<u64> = BTreeSet::new();
    loop {
        names.clear();
        for &i in &by_target {
            if ents[i].keep {
                *names.entry(ents[i].ino).or_default() += 1;
            }
        }
        let newly: Vec<u64> = recs
            .iter()
            .filter(|r| {
                r.state == SlotState::Unlinked
                    && !r.system
                    && r.ino != root
                    && names.get(&r.ino).copied().unwrap_or(0) == 0
                    && !freed.contains(&r.ino)
            })
            .map(|r| r.ino)
            .collect();
        if newly.is_empty() {
            break;
        }
        for t in newly {
            freed.insert(t);
            if let Some(&(a, b)) = range.get(&t) {
                ents[a..b].iter_mut().for_each(|e| e.keep = false);
            }
        }
    }
    by_target.retain(|&i| ents[i].keep);
    // 7. Unreached: unlinked inodes are freed, damaged ones cleared, the rest reconnected.
    for r in recs.iter() {
        if freed.contains(&r.ino) {
            let blocks: u64 = r.extents.iter().map(|e| e.subblocks as u64).sum();
            problems.push(
                Problem::new(
                    ProblemKind::UnlinkedInode,
                    format!("{} of {} bytes is in use but has no links (open and unlinked when the file system stopped)", kind_name(r.mode), r.size),
                    format!("free the inode and its {blocks} subblocks"),
                )
                .ino(r.ino)
                .at(r.slot),
            );
            plan.free.push(r.ino);
        }
        // A damaged root is rewritten in place, not cleared.
        if r.state == SlotState::Bad && !(r.ino == root && plan.recreate_root) {
            plan.clear.push(r.ino);
        }
    }
    let mut orphans: Vec<u64> = Vec::new();
    loop {
        let unreached: Vec<usize> = (0..recs.len())
            .filter(|&i| {
                let r = &recs[i];
                r.live()
                    && !r.system
                    && r.ino != root
                    && !reached.contains(&r.ino)
                    && !freed.contains(&r.ino)
            })
            .collect();
        if unreached.is_empty() {
            break;
        }
        let mut tops: Vec<u64> = unreached
            .iter()
            .map(|&i| recs[i].ino)
            .filter(|t| names.get(t).copied().unwrap_or(0) == 0)
            .collect();
        if tops.is_empty() {
            // Only directories naming each other in a loop are left: cut the loop at
            // the lowest-numbered one.
            let t = unreached
                .iter()
                .map(|&i| recs[i].ino)
                .find(|&t| rec(recs, t).is_some_and(|i| recs[i].is_dir()))
                .unwrap_or(recs[unreached[0]].ino);
            for &i in &by_target {
                if ents[i].ino == t && ents[i].keep {
                    ents[i].keep = false;
                    changed.insert(ents[i].dir);
                }
            }
            names.remove(&t);
            tops.push(t);
        }
        for t in tops {
            orphans.push(t);
            walk_from(t, &mut reached, &ents, recs);
        }
    }
    // 8. /lost+found.
    let mut additions: BTreeMap<u64, Vec<NewEntry>> = BTreeMap::new();
    let mut lost_found = None;
    if !orphans.is_empty() {
        let existing = if root_ok {
            let (a, b) = children(root);
            ents[a..b]
                .iter()
                .find(|e| {
                    e.keep
                        && e.name == LOST_FOUND
                        && rec(recs, e.ino).is_some_and(|i| recs[i].is_dir() && recs[i].live())
                })
                .map(|e| e.ino)
        } else {
            None
        };
        let name_taken = root_ok && {
            let (a, b) = children(root);
            ents[a..b].iter().any(|e| e.keep && e.name == LOST_FOUND)
        };
        lost_found = match existing {
            Some(lf) => Some(lf),
            None => {
                // A slot no entry names: free, or freed or cleared by this run (the new
                // inode then overwrites it); else the first slot of a new inode-file block.
                let taken_targets: BTreeSet<u64> = ents.iter().map(|e| e.ino).collect();
                let limit = slots.min(l.desc.inodes_max);
                let reusable = |i: u64| match rec(recs, i) {
                    None => true,
                    Some(x) => freed.contains(&i) || (recs[x].state == SlotState::Bad && i != root),
                };
                let mut free_slot = (m.first_user_inode..limit)
                    .find(|&i| reusable(i) && !taken_targets.contains(&i));
                if free_slot.is_none() && slots < l.desc.inodes_max {
                    free_slot = Some(slots);
                    plan.grow_inode_file = true;
                }
                let lf_name: Vec<u8> = if name_taken {
                    b"lost+found.fsck".to_vec()
                } else {
                    LOST_FOUND.to_vec()
                };
                match free_slot {
                    Some(lf) => {
                        problems.push(Problem::new(
                            ProblemKind::LostFound,
                            format!(
                                "there is no /{} to reconnect {} orphaned inode(s) into",
                                show(&lf_name),
                                orphans.len()
                            ),
                            if plan.grow_inode_file {
                                format!(
                                    "grow the inode file by a block and create /{} as inode {lf}",
                                    show(&lf_name)
                                )
                            } else {
                                format!("create /{} as inode {lf}", show(&lf_name))
                            },
                        ));
                        plan.create_lost_found = Some(lf);
                        additions.entry(root).or_default().push(NewEntry {
                            name: lf_name,
                            ino: lf,
                            kind: dtype(LOST_FOUND_MODE),
                        });
                        Some(lf)
                    }
                    None => {
                        problems.push(
                            Problem::new(
                                ProblemKind::LostFound,
                                format!("no inode number left for /lost+found ({} orphaned inodes wait): all {} are in use", orphans.len(), l.desc.inodes_max),
                                "free inodes (delete files) or raise the inode limit, then run fsck again",
                            )
                            .uncorrectable(),
                        );
                        None
                    }
                }
            }
        };
    }
    let mut orphan_parent: HashMap<u64, u64> = HashMap::new();
    if let Some(lf) = lost_found {
        let mut used: BTreeSet<Vec<u8>> = match range.get(&lf) {
            Some(&(a, b)) => ents[a..b]
                .iter()
                .filter(|e| e.keep)
                .map(|e| e.name.clone())
                .collect(),
            None => BTreeSet::new(),
        };
        for &t in &orphans {
            let r = &recs[rec(recs, t).expect("orphans are records")];
            let mut name = format!("#{t}").into_bytes();
            let mut n = 1;
            while used.contains(&name) {
                name = format!("#{t}.{n}").into_bytes();
                n += 1;
            }
            used.insert(name.clone());
            problems.push(
                Problem::new(
                    ProblemKind::Orphan,
                    format!(
                        "{} of {} bytes is in use but no path from the root reaches it",
                        kind_name(r.mode),
                        r.size
                    ),
                    format!("reconnect it as /lost+found/{}", show(&name)),
                )
                .ino(t)
                .at(r.slot),
            );
            additions.entry(lf).or_default().push(NewEntry {
                name,
                ino: t,
                kind: r.dtype(),
            });
            orphan_parent.insert(t, lf);
            *names.entry(t).or_default() += 1;
        }
    } else {
        for &t in &orphans {
            let r = &recs[rec(recs, t).expect("orphans are records")];
            problems.push(
                Problem::new(
                    ProblemKind::Orphan,
                    format!(
                        "{} of {} bytes is in use but no path from the root reaches it",
                        kind_name(r.mode),
                        r.size
                    ),
                    "none without a /lost+found",
                )
                .ino(t)
                .at(r.slot)
                .uncorrectable(),
            );
        }
    }
    for &d in additions.keys() {
        changed.insert(d);
    }
    // 9. Final entries of every directory that changes.
    for &d in &changed {
        let mut list: Vec<NewEntry> = match range.get(&d) {
            Some(&(a, b)) => ents[a..b]
                .iter()
                .filter(|e| e.keep)
                .map(|e| NewEntry {
                    name: e.name.clone(),
                    ino: e.ino,
                    kind: e.kind,
                })
                .collect(),
            None => Vec::new(),
        };
        if let Some(add) = additions.get(&d) {
            list.extend(add.iter().cloned());
        }
        plan.dirs.insert(d, list);
    }
    // 10. Link counts and parents from the final names.
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    let mut parent_of: HashMap<u64, u64> = HashMap::new();
    let final_entries = |d: u64| -> Vec<(u64, u8)> {
        match plan.dirs.get(&d) {
            Some(list) => list.iter().map(|e| (e.ino, e.kind)).collect(),
            None => match range.get(&d) {
                Some(&(a, b)) => ents[a..b]
                    .iter()
                    .filter(|e| e.keep)
                    .map(|e| (e.ino, e.kind))
                    .collect(),
                None => Vec::new(),
            },
        }
    };
    let mut dirs_live: Vec<u64> = recs
        .iter()
        .filter(|r| r.live() && r.is_dir() && !r.system && !freed.contains(&r.ino))
        .map(|r| r.ino)
        .collect();
    if let Some(lf) = plan.create_lost_found {
        dirs_live.push(lf);
    }
    if !root_ok {
        dirs_live.push(root);
    }
    dirs_live.sort_unstable();
    dirs_live.dedup();
    for &d in &dirs_live {
        for (t, kind) in final_entries(d) {
            if kind == dtype(S_IFDIR) {
                *subdirs.entry(d).or_default() += 1;
                parent_of.insert(t, d);
            }
        }
    }
    for t in orphan_parent.keys() {
        parent_of.entry(*t).or_insert(orphan_parent[t]);
    }
    let mut new_names = names.clone();
    if let Some(lf) = plan.create_lost_found {
        new_names.insert(lf, 1);
    }
    for r in recs.iter() {
        if !r.live() || r.system || freed.contains(&r.ino) || (r.ino == root && !root_ok) {
            continue;
        }
        let want = if r.is_dir() {
            2 + subdirs.get(&r.ino).copied().unwrap_or(0)
        } else {
            new_names.get(&r.ino).copied().unwrap_or(0)
        };
        if want != r.nlink {
            let what = if r.is_dir() {
                format!(
                    "link count is {}, the directory has {} subdirectories (2 + {} = {want})",
                    r.nlink,
                    want - 2,
                    want - 2
                )
            } else {
                format!("link count is {}, the file has {want} name(s)", r.nlink)
            };
            problems.push(
                Problem::new(ProblemKind::LinkCount, what, format!("set it to {want}"))
                    .ino(r.ino)
                    .at(r.slot),
            );
            plan.nlink.insert(r.ino, want);
        }
        if r.is_dir() {
            let want_parent = if r.ino == root {
                root
            } else {
                parent_of.get(&r.ino).copied().unwrap_or(root)
            };
            if r.parent != want_parent {
                problems.push(
                    Problem::new(
                        ProblemKind::BadParent,
                        format!("`..` names inode {}, but the directory's name is in directory {want_parent}", r.parent),
                        format!("set `..` to {want_parent}"),
                    )
                    .ino(r.ino)
                    .at(r.slot),
                );
                plan.parent.insert(r.ino, want_parent);
            }
        }
    }
    if let Some(lf) = plan.create_lost_found {
        plan.nlink
            .insert(lf, 2 + subdirs.get(&lf).copied().unwrap_or(0));
        plan.parent.insert(lf, root);
    }
    if !root_ok {
        plan.nlink
            .insert(root, 2 + subdirs.get(&root).copied().unwrap_or(0));
        plan.parent.insert(root, root);
        plan.dirs.entry(root).or_default();
    }
    plan.root = root;
    progress.update(Phase::Namespace, ents.len() as u64, ents.len() as u64);
    plan.by_target = by_target.into_iter().filter(|&i| ents[i].keep).collect();
    plan.ents = ents;
    plan
}

impl NsPlan {
    /// One name of `ino` that exists now and stays: (directory, name). Names fsck
    /// adds are not used: in a check-only run they do not exist.
    fn name_of(&self, ino: u64) -> Option<(u64, &[u8])> {
        let at = self.by_target.partition_point(|&i| self.ents[i].ino < ino);
        let &i = self.by_target.get(at)?;
        (self.ents[i].ino == ino).then(|| (self.ents[i].dir, self.ents[i].name.as_slice()))
    }

    /// A path of `ino` from the root, when every directory on the way is known.
    pub fn path(&self, ino: u64) -> Option<String> {
        if ino == self.root {
            return Some("/".into());
        }
        let mut parts = Vec::new();
        let mut cur = ino;
        for _ in 0..4096 {
            if cur == self.root {
                parts.reverse();
                return Some(format!("/{}", parts.join("/")));
            }
            let (parent, name) = self.name_of(cur)?;
            parts.push(show(name));
            cur = parent;
        }
        None
    }
}
