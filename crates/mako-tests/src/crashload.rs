//! A crash workload and its checker, for `kill -9` tests of makod (and any other file
//! system): the workload runs random operations in a directory and writes, to a journal
//! on another file system, what it is about to do and what the file system has
//! promised; after the crash, the checker replays the journal and says what must be
//! true of the recovered tree.
//!
//! Promises follow POSIX and Mako's log: `fsync` of a file makes its data and every
//! metadata change made before the call durable (one compound log transaction, as in
//! ext4 and GPFS). So after a crash:
//! - a file whose last write was followed by a returned fsync has exactly that content;
//! - a rename or unlink followed by any returned fsync happened;
//! - a rename that returned but was not followed by an fsync is atomic: the file is
//!   under exactly one of its names (old or new), never both, never neither;
//! - a file being rewritten when the crash came has unknown content but exists.
//!
//! A journal covers one run, ended by one crash: an operation the crash left uncertain
//! stays uncertain (old or new name), so runs across several crashes use one journal
//! each and check them all.
//!
//! Journal lines (one `write(2)` each, so nothing is lost when the workload dies):
//! `W <path>` before rewriting a durable file, `D <path> <size> <hash>` after its
//! fsync returned, `R+ <old> <new>` before a rename of a durable file and `R <old> <new>`
//! after it returned, `U+ <path>` / `U <path>` likewise for unlink, `S` after an fsync
//! (of anything) returned.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// FNV-1a, 64 bits: a content fingerprint stable across processes and builds.
pub fn content_hash(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// The journal the workload appends to.
struct Journal(File);
impl Journal {
    fn line(&mut self, s: &str) -> std::io::Result<()> {
        self.0.write_all(format!("{s}\n").as_bytes())
    }
}

fn fsync_path(p: &Path) -> std::io::Result<()> {
    File::open(p)?.sync_all()
}

/// Random sizes around Mako's interesting boundaries: data-in-inode, fragments, full
/// blocks, several blocks.
fn size(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0 => 0,
        1..=3 => rng.below(4000) as usize,
        4..=6 => rng.below(200_000) as usize,
        7 | 8 => rng.below(2_000_000) as usize,
        _ => 4 * 1024 * 1024 + rng.below(3_000_000) as usize,
    }
}

/// Run the workload in `dir` (created), journaling to `journal`, for at most `ops`
/// operations. Returns when the file system fails (the daemon was killed) or when done.
pub fn run(dir: &Path, journal: &Path, seed: u64, ops: u64) -> std::io::Result<u64> {
    let mut rng = Rng(seed | 1);
    let mut j = Journal(OpenOptions::new().create(true).append(true).open(journal)?);
    std::fs::create_dir_all(dir)?;
    std::fs::create_dir_all(dir.join("sub"))?;
    let mut durable: Vec<PathBuf> = Vec::new();
    let mut noise: Vec<PathBuf> = Vec::new();
    let mut n = 0u64;
    for op in 0..ops {
        n = op;
        match rng.below(100) {
            // A new file, written and fsynced: a promise.
            0..=29 => {
                let p = dir.join(format!("d{op}"));
                let n = size(&mut rng);
                let data = rng.bytes(n);
                let mut f = OpenOptions::new().create_new(true).write(true).open(&p)?;
                f.write_all(&data)?;
                f.sync_all()?;
                j.line(&format!(
                    "D {} {} {}",
                    p.display(),
                    data.len(),
                    content_hash(&data)
                ))?;
                durable.push(p);
            }
            // Rewrite a durable file in place (same or other size), then fsync.
            30..=37 if !durable.is_empty() => {
                let p = durable[rng.below(durable.len() as u64) as usize].clone();
                j.line(&format!("W {}", p.display()))?;
                let n = size(&mut rng);
                let data = rng.bytes(n);
                let f = OpenOptions::new().write(true).open(&p)?;
                f.set_len(0)?;
                f.write_all_at(&data, 0)?;
                f.sync_all()?;
                j.line(&format!(
                    "D {} {} {}",
                    p.display(),
                    data.len(),
                    content_hash(&data)
                ))?;
            }
            // Rename a durable file (within the directory or into sub/).
            38..=49 if !durable.is_empty() => {
                let i = rng.below(durable.len() as u64) as usize;
                let old = durable[i].clone();
                let new = if rng.below(2) == 0 {
                    dir.join(format!("r{op}"))
                } else {
                    dir.join("sub").join(format!("r{op}"))
                };
                j.line(&format!("R+ {} {}", old.display(), new.display()))?;
                std::fs::rename(&old, &new)?;
                j.line(&format!("R {} {}", old.display(), new.display()))?;
                durable[i] = new;
            }
            // Unlink a durable file.
            50..=54 if !durable.is_empty() => {
                let i = rng.below(durable.len() as u64) as usize;
                let p = durable.swap_remove(i);
                j.line(&format!("U+ {}", p.display()))?;
                std::fs::remove_file(&p)?;
                j.line(&format!("U {}", p.display()))?;
            }
            // Noise: files written without fsync, overwritten, truncated, linked, xattrs.
            55..=74 => {
                let p = dir.join(format!("n{}", rng.below(40)));
                let n = size(&mut rng) / 4;
                let data = rng.bytes(n);
                let f = OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .mode(0o644)
                    .open(&p)?;
                f.write_all_at(&data, rng.below(100_000))?;
                if rng.below(4) == 0 {
                    f.set_len(rng.below(300_000))?;
                }
                if !noise.contains(&p) {
                    noise.push(p);
                }
            }
            75..=79 if !noise.is_empty() => {
                let src = noise[rng.below(noise.len() as u64) as usize].clone();
                let dst = dir.join(format!("l{op}"));
                match std::fs::hard_link(&src, &dst) {
                    Ok(()) => noise.push(dst),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            80..=84 if !noise.is_empty() => {
                let i = rng.below(noise.len() as u64) as usize;
                let p = noise.swap_remove(i);
                match std::fs::remove_file(&p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            85..=89 => {
                let d = dir.join(format!("tree{}", rng.below(5)));
                let sub = d.join(format!("x{}", rng.below(5)));
                match std::fs::create_dir_all(&sub) {
                    Ok(()) => {}
                    Err(e) => return Err(e),
                }
                if rng.below(3) == 0 {
                    let _ = std::fs::remove_dir(&sub);
                }
            }
            90..=93 if !noise.is_empty() => {
                let p = &noise[rng.below(noise.len() as u64) as usize];
                let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
                let n = rng.below(200) as usize;
                let v = rng.bytes(n);
                let r = unsafe {
                    libc::setxattr(
                        c.as_ptr(),
                        c"user.crash".as_ptr(),
                        v.as_ptr().cast(),
                        v.len(),
                        0,
                    )
                };
                if r != 0 {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::ENOENT) {
                        return Err(e);
                    }
                }
            }
            // fsync of a directory or a noise file: every completed change is durable.
            _ => {
                let target = if rng.below(2) == 0 || noise.is_empty() {
                    dir.to_path_buf()
                } else {
                    noise[rng.below(noise.len() as u64) as usize].clone()
                };
                match fsync_path(&target) {
                    Ok(()) => j.line("S")?,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(n)
}

/// What the checker expects of one file the workload made promises about.
#[derive(Debug, Clone)]
struct Tracked {
    /// The names it may be found under: the last durable one first, then names of
    /// renames not yet durable (it is under exactly one of them).
    names: Vec<PathBuf>,
    /// It may have been unlinked (an unlink issued but not durable).
    maybe_gone: bool,
    gone: bool,
    /// Expected content (size, hash), unless a rewrite was in flight.
    content: Option<(u64, u64)>,
}

/// Replay a journal into expectations and check them against the tree. Returns the
/// number of files checked, or every violation found.
pub fn check(journal: &Path) -> Result<usize, Vec<String>> {
    let mut text = String::new();
    File::open(journal)
        .and_then(|mut f| f.read_to_string(&mut text))
        .map_err(|e| vec![format!("journal {}: {e}", journal.display())])?;
    // Files by current (latest) name.
    let mut files: BTreeMap<PathBuf, Tracked> = BTreeMap::new();
    // Changes completed but not yet followed by an fsync.
    let mut undurable: Vec<PathBuf> = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["D", p, size, hash] => {
                let p = PathBuf::from(p);
                let t = files.entry(p.clone()).or_insert(Tracked {
                    names: vec![p.clone()],
                    maybe_gone: false,
                    gone: false,
                    content: None,
                });
                t.content = Some((size.parse().unwrap_or(0), hash.parse().unwrap_or(0)));
                // An fsync returned: everything before is durable.
                make_durable(&mut files, &mut undurable);
            }
            ["W", p] => {
                if let Some(t) = files.get_mut(Path::new(p)) {
                    t.content = None;
                }
            }
            ["R+", old, new] | ["R", old, new] => {
                let (old, new) = (PathBuf::from(old), PathBuf::from(new));
                if let Some(mut t) = files.remove(&old) {
                    if !t.names.contains(&new) {
                        t.names.push(new.clone());
                    }
                    files.insert(new.clone(), t);
                }
                if parts[0] == "R" {
                    undurable.push(new);
                }
            }
            ["U+", p] | ["U", p] => {
                let p = PathBuf::from(p);
                if let Some(t) = files.get_mut(&p) {
                    t.maybe_gone = true;
                }
                if parts[0] == "U" {
                    undurable.push(p);
                }
            }
            ["S"] => make_durable(&mut files, &mut undurable),
            [""] | [] => {}
            _ => return Err(vec![format!("journal line not understood: {line:?}")]),
        }
    }
    let mut problems = Vec::new();
    let mut checked = 0;
    for (latest, t) in &files {
        if t.gone {
            if latest.exists() {
                problems.push(format!(
                    "{}: unlinked and made durable, but it exists",
                    latest.display()
                ));
            }
            continue;
        }
        let present: Vec<&PathBuf> = t.names.iter().filter(|n| n.exists()).collect();
        // A file under several names at once would be a non-atomic rename; the old
        // names of completed renames may also be reused by nothing else in this workload.
        if present.len() > 1 {
            problems.push(format!(
                "{}: found under {} names at once: {present:?} (rename not atomic)",
                latest.display(),
                present.len()
            ));
            continue;
        }
        let Some(found) = present.first() else {
            if !t.maybe_gone {
                let why: Vec<String> = t
                    .names
                    .iter()
                    .map(|n| match std::fs::symlink_metadata(n) {
                        Ok(_) => format!("{}: exists", n.display()),
                        Err(e) => format!("{}: {e}", n.display()),
                    })
                    .collect();
                problems.push(format!(
                    "{}: missing; expected under one of {:?} ({})",
                    latest.display(),
                    t.names,
                    why.join("; ")
                ));
            }
            continue;
        };
        checked += 1;
        if let Some((size, hash)) = t.content {
            let mut data = Vec::new();
            match File::open(found).and_then(|mut f| f.read_to_end(&mut data)) {
                Ok(_) => {
                    if data.len() as u64 != size || content_hash(&data) != hash {
                        problems.push(format!(
                            "{}: fsynced content lost: {} bytes (hash {:x}), expected {size} bytes (hash {hash:x})",
                            found.display(),
                            data.len(),
                            content_hash(&data)
                        ));
                    }
                }
                Err(e) => problems.push(format!("{}: cannot read: {e}", found.display())),
            }
        }
    }
    if problems.is_empty() {
        Ok(checked)
    } else {
        Err(problems)
    }
}

/// Everything completed so far is durable: renames settle on their new name, unlinks
/// happened.
fn make_durable(files: &mut BTreeMap<PathBuf, Tracked>, undurable: &mut Vec<PathBuf>) {
    for p in undurable.drain(..) {
        if let Some(t) = files.get_mut(&p) {
            if t.maybe_gone {
                t.gone = true;
            } else {
                t.names = vec![p.clone()];
            }
        }
    }
    for t in files.values_mut() {
        if t.maybe_gone {
            t.gone = true;
        }
        if let Some(last) = t.names.last().cloned() {
            t.names = vec![last];
        }
    }
}

/// Walk a tree: every directory listable, every entry stat-able, every file readable
/// to its end. Returns entries walked or the first errors.
pub fn walk(root: &Path) -> Result<u64, Vec<String>> {
    let mut problems = Vec::new();
    let mut n = 0;
    let mut stack = vec![root.to_path_buf()];
    let mut buf = vec![0u8; 1 << 20];
    while let Some(d) = stack.pop() {
        let rd = match std::fs::read_dir(&d) {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("{}: readdir: {e}", d.display()));
                continue;
            }
        };
        for e in rd {
            let e = match e {
                Ok(e) => e,
                Err(err) => {
                    problems.push(format!("{}: readdir entry: {err}", d.display()));
                    continue;
                }
            };
            n += 1;
            let p = e.path();
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => stack.push(p),
                Ok(m) if m.is_file() => match File::open(&p) {
                    Ok(f) => {
                        let mut off = 0u64;
                        loop {
                            match f.read_at(&mut buf, off) {
                                Ok(0) => break,
                                Ok(k) => off += k as u64,
                                Err(err) => {
                                    problems.push(format!("{}: read at {off}: {err}", p.display()));
                                    break;
                                }
                            }
                        }
                        if off != m.len() {
                            problems.push(format!(
                                "{}: read {off} bytes, size says {}",
                                p.display(),
                                m.len()
                            ));
                        }
                    }
                    Err(err) => problems.push(format!("{}: open: {err}", p.display())),
                },
                Ok(_) => {}
                Err(err) => problems.push(format!("{}: stat: {err}", p.display())),
            }
            if problems.len() > 20 {
                return Err(problems);
            }
        }
    }
    if problems.is_empty() {
        Ok(n)
    } else {
        Err(problems)
    }
}
