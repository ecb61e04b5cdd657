//! Directory structure, as `mako_fs::directory` reads it: entries in the inode, in one
//! fragment, or in extendible-hash blocks. A directory is consistent when lookup can
//! find every entry:
//! - the size says the shape (fragment: `last_block_subblocks` × subblock; hashed:
//!   a power of two of directory blocks, whose log2 is the global depth);
//! - every block decodes with its identity, its capacity is its allocation, and its
//!   depth is at most the global depth;
//! - the blocks' cookie ranges tile the whole cookie space, so `locate` finds exactly
//!   one block for every cookie;
//! - every entry sits at its name's home cookie or after an unbroken run of occupied
//!   cookies from it (lookup probes upward from the home and stops at the first free
//!   cookie: a gap is a broken hash chain);
//! - no name appears twice; the inode's `entries` counts them.
//!
//! Anything broken here is repaired by rebuilding the directory from its readable
//! entries (`dir_build`).

use crate::layout::Layout;
use crate::problem::{describe, Problem, ProblemKind};
use crate::reader::MetadataReader;
use crate::tree::Walk;
use mako_disk::BufferType;
use mako_format::dir_block::{cookie_range, DirBlock, DirBlockId, DirEntry};
use mako_format::error::Location;
use mako_format::inode::{payload_bytes, xattrs_encoded_len, Inode, InodeContent};
use mako_format::name_hash::{home_cookie, COOKIE_MAX};
use mako_format::DiskAddress;
use std::collections::HashMap;

/// What the scan keeps of a directory.
#[derive(Debug, Default)]
pub struct DirScan {
    /// Readable entries, in cookie order, duplicates dropped.
    pub entries: Vec<DirEntry>,
    /// The structure must be rewritten.
    pub rebuild: bool,
    /// The `entries` field disagrees with an intact structure: the right count.
    pub count_fix: Option<u64>,
}

/// Bytes of entries the inode has room for.
pub fn inline_room(l: &Layout, inode: &Inode) -> usize {
    payload_bytes(l.geo.inode_bytes).saturating_sub(xattrs_encoded_len(&inode.xattrs))
}

/// Units and global depth a directory out of its inode must have, from its size.
fn shape(l: &Layout, inode: &Inode) -> Result<(u64, u8), String> {
    let unit = l.dir_block_bytes();
    let size = inode.size;
    let lbs = inode.last_block_subblocks as u64;
    if size == 0 {
        return Err("is out of its inode but has size 0".into());
    }
    if size < unit {
        if lbs == 0 || lbs * l.sb_bytes != size {
            return Err(format!(
                "has size {size}, a fragment, but its last block is {lbs} subblocks of {} bytes",
                l.sb_bytes
            ));
        }
        return Ok((1, 0));
    }
    if size % unit != 0 || !(size / unit).is_power_of_two() {
        return Err(format!(
            "has size {size}, not a power of two of {unit}-byte directory blocks"
        ));
    }
    if lbs != 0 {
        return Err(format!(
            "has full directory blocks but says its last block is a fragment of {lbs} subblocks"
        ));
    }
    Ok((size / unit, (size / unit).trailing_zeros() as u8))
}

fn entry_name(e: &DirEntry) -> String {
    String::from_utf8_lossy(&e.name).into_owned()
}

/// Check directory `inode` (whose tree `walk` describes when it is out of its inode).
pub fn check(
    l: &Layout,
    r: &dyn MetadataReader,
    inode: &Inode,
    walk: Option<&Walk>,
    slot: DiskAddress,
    problems: &mut Vec<Problem>,
) -> DirScan {
    let ino = inode.ino;
    let mut scan = DirScan::default();
    // Damage that loses entries: chains and tiling cannot be judged, the rebuild covers them.
    let mut lossy = false;
    let mut entries: Vec<DirEntry> = match &inode.content {
        InodeContent::InlineDir(e) => e.clone(),
        InodeContent::InlineData(_) => Vec::new(), // decoders never give a directory inline data
        InodeContent::Pointers(_) => {
            let walk = walk.expect("a directory with pointers has a walk");
            let shape = shape(l, inode);
            if let Err(why) = &shape {
                problems.push(
                    Problem::new(
                        ProblemKind::DirectoryShape,
                        format!("directory {why}"),
                        "rebuild the directory from its readable entries",
                    )
                    .ino(ino)
                    .at(slot),
                );
                scan.rebuild = true;
            }
            if !walk.lost.is_empty() {
                lossy = true;
            }
            let mut out = Vec::new();
            let mut ranges = Vec::new();
            for &(u, da, n) in &walk.units {
                let mut buf = vec![0u8; (n as u64 * l.sb_bytes) as usize];
                let block = r
                    .read(da, &mut buf, BufferType::Directory, ino)
                    .map_err(|e| format!("directory block {u} at {da} cannot be read: {e}"))
                    .and_then(|()| {
                        DirBlock::decode(&buf, DirBlockId { ino, index: u }, Location::Disk(da))
                            .map_err(|e| describe(&e))
                    });
                let block = match block {
                    Ok(b) => b,
                    Err(why) => {
                        problems.push(
                            Problem::new(
                                ProblemKind::BadDirectoryBlock,
                                format!("directory block {u}: {why}; the entries it held are lost"),
                                "rebuild the directory from its readable entries; files that lose their name go to /lost+found",
                            )
                            .ino(ino)
                            .at(da),
                        );
                        lossy = true;
                        continue;
                    }
                };
                let allocated = n as u64 * l.sb_bytes;
                if block.capacity_bytes as u64 != allocated {
                    problems.push(
                        Problem::new(
                            ProblemKind::DirectoryShape,
                            format!("directory block {u} says it holds {} bytes but {allocated} are allocated to it", block.capacity_bytes),
                            "rebuild the directory from its readable entries",
                        )
                        .ino(ino)
                        .at(da),
                    );
                    scan.rebuild = true;
                }
                if let Ok((_, g)) = shape {
                    if block.depth > g {
                        problems.push(
                            Problem::new(
                                ProblemKind::DirectoryShape,
                                format!("directory block {u} has hash depth {}, deeper than the directory's {g}", block.depth),
                                "rebuild the directory from its readable entries",
                            )
                            .ino(ino)
                            .at(da),
                        );
                        scan.rebuild = true;
                    }
                }
                let (lo, hi) = cookie_range(u, block.depth);
                ranges.push((lo, hi, u, da));
                out.extend(block.entries);
            }
            if !lossy && !scan.rebuild {
                if let Some(why) = tiling_gap(&mut ranges) {
                    problems.push(
                        Problem::new(
                            ProblemKind::DirectoryShape,
                            format!("directory hash blocks do not tile the cookie space: {why}; lookups there fail"),
                            "rebuild the directory from its readable entries",
                        )
                        .ino(ino)
                        .at(slot),
                    );
                    scan.rebuild = true;
                }
            }
            out.sort_by_key(|e| e.cookie);
            out.dedup_by_key(|e| e.cookie);
            out
        }
    };
    if lossy {
        scan.rebuild = true;
    }
    // Names: a second entry with a name is unreachable (lookup stops at the first).
    let mut seen: HashMap<&[u8], u64> = HashMap::with_capacity(entries.len());
    let mut dups = Vec::new();
    for e in &entries {
        if let Some(&first) = seen.get(e.name.as_slice()) {
            dups.push(e.cookie);
            problems.push(
                Problem::new(
                    ProblemKind::DuplicateName,
                    format!(
                        "name {:?} appears twice (cookies {first} and {}, inodes {} and this one {}): lookup only finds the first",
                        entry_name(e),
                        e.cookie,
                        entries.iter().find(|x| x.cookie == first).map_or(0, |x| x.ino),
                        e.ino
                    ),
                    "drop the second entry; if that leaves its inode without a name it goes to /lost+found",
                )
                .ino(ino)
                .at(slot),
            );
        } else {
            seen.insert(e.name.as_slice(), e.cookie);
        }
    }
    drop(seen);
    if !dups.is_empty() {
        entries.retain(|e| !dups.contains(&e.cookie));
        scan.rebuild = true;
    }
    if !lossy {
        // Hash chains: entries between the home cookie and the entry's must all exist.
        let cookies: Vec<u64> = entries.iter().map(|e| e.cookie).collect();
        for (p, e) in entries.iter().enumerate() {
            let home = home_cookie(&e.name);
            let broken = if e.cookie < home {
                Some(format!(
                    "sits at cookie {} before its name's home cookie {home}",
                    e.cookie
                ))
            } else if e.cookie > home {
                let from = cookies.partition_point(|&c| c < home);
                let present = (p - from) as u64;
                let needed = e.cookie - home;
                (present != needed).then(|| {
                    let gap = (home..e.cookie).find(|c| cookies.binary_search(c).is_err()).unwrap_or(home);
                    format!("sits at cookie {}, its name's home cookie is {home} and cookie {gap} in between is free", e.cookie)
                })
            } else {
                None
            };
            if let Some(why) = broken {
                problems.push(
                    Problem::new(
                        ProblemKind::BrokenHashChain,
                        format!(
                            "entry {:?} (inode {}) cannot be found by lookup: it {why}",
                            entry_name(e),
                            e.ino
                        ),
                        "rebuild the directory so that every entry sits on its name's probe chain",
                    )
                    .ino(ino)
                    .at(slot),
                );
                scan.rebuild = true;
            }
        }
        let count = entries.len() as u64 + dups.len() as u64;
        if !scan.rebuild && inode.entries != count {
            problems.push(
                Problem::new(
                    ProblemKind::InodeField,
                    format!(
                        "directory says it has {} entries, it holds {count}",
                        inode.entries
                    ),
                    format!("set the entry count to {count}"),
                )
                .ino(ino)
                .at(slot),
            );
            scan.count_fix = Some(count);
        }
    }
    scan.entries = entries;
    scan
}

/// Sort the blocks' ranges and say where they fail to tile [0, COOKIE_MAX].
fn tiling_gap(ranges: &mut [(u64, u64, u64, DiskAddress)]) -> Option<String> {
    ranges.sort_by_key(|r| r.0);
    let mut next = 0u64;
    for (k, &(lo, hi, u, _)) in ranges.iter().enumerate() {
        if lo > next {
            return Some(format!("no block covers cookies {next}..{}", lo - 1));
        }
        if lo < next {
            return Some(format!(
                "block {u} overlaps the block before it at cookie {lo}"
            ));
        }
        if hi == COOKIE_MAX {
            return ranges.get(k + 1).map(|r| {
                format!(
                    "block {} overlaps the block before it at cookie {}",
                    r.2, r.0
                )
            });
        }
        next = hi + 1;
    }
    Some(format!("no block covers cookies {next}..{COOKIE_MAX}"))
}
