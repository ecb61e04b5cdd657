//! Checks for readdir: completeness, d_type, stability under concurrent modification, and
//! telldir/seekdir cookies.

use super::*;
use crate::sys::*;
use std::collections::HashMap;
use std::ffi::CStr;

pub(super) const CHECKS: CheckTable = &[
    ("readdir_all_names", readdir_all_names),
    (
        "readdir_modified_during_iteration",
        readdir_modified_during_iteration,
    ),
    ("readdir_telldir_seekdir", readdir_telldir_seekdir),
];

/// A `DIR*` stream, closed on drop.
struct DirStream(*mut libc::DIR);

impl DirStream {
    fn open(p: &Path) -> SysResult<DirStream> {
        let c = cstr(p);
        let d = unsafe { libc::opendir(c.as_ptr()) };
        if d.is_null() {
            Err(Errno::last())
        } else {
            Ok(DirStream(d))
        }
    }
    /// Next entry as (name, d_type), `None` at end.
    fn next(&mut self) -> SysResult<Option<(String, u8)>> {
        unsafe { *libc::__errno_location() = 0 };
        let e = unsafe { libc::readdir64(self.0) };
        if e.is_null() {
            let err = Errno::last();
            return if err.0 == 0 { Ok(None) } else { Err(err) };
        }
        let name = unsafe { CStr::from_ptr((*e).d_name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(Some((name, unsafe { (*e).d_type })))
    }
    fn tell(&self) -> i64 {
        unsafe { libc::telldir(self.0) as i64 }
    }
    fn seek(&mut self, pos: i64) {
        unsafe { libc::seekdir(self.0, pos as libc::c_long) }
    }
    fn rewind(&mut self) {
        unsafe { libc::rewinddir(self.0) }
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        unsafe { libc::closedir(self.0) };
    }
}

fn read_all(p: &Path) -> Result<Vec<(String, u8)>, CheckError> {
    let mut d = DirStream::open(p).ctx("opendir")?;
    let mut v = Vec::new();
    while let Some(e) = d.next().ctx("readdir")? {
        v.push(e);
    }
    Ok(v)
}

fn count(entries: &[(String, u8)]) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for (n, _) in entries {
        *m.entry(n.clone()).or_insert(0) += 1;
    }
    m
}

fn readdir_all_names(c: &Ctx) -> CheckResult {
    let d = c.p("d");
    mkdir(&d, 0o755).ctx("mkdir")?;
    let empty = count(&read_all(&d)?);
    check_eq(
        empty.len(),
        2,
        format!(
            "entries of an empty dir (got {:?})",
            empty.keys().collect::<Vec<_>>()
        ),
    )?;
    ensure(
        empty.get(".") == Some(&1) && empty.get("..") == Some(&1),
        "empty dir lists '.' and '..' once",
    )?;
    let mut expected = HashMap::new();
    for i in 0..400 {
        // Varied name lengths exercise directory block packing.
        let name = format!("e{i}_{}", "n".repeat(i % 70));
        let p = d.join(&name);
        let t = match i % 4 {
            0 | 1 => {
                write_file(&p, b"", 0o644).ctx("create")?;
                libc::DT_REG
            }
            2 => {
                mkdir(&p, 0o755).ctx("mkdir")?;
                libc::DT_DIR
            }
            _ => {
                symlink("target", &p).ctx("symlink")?;
                libc::DT_LNK
            }
        };
        expected.insert(name, t);
    }
    let entries = read_all(&d)?;
    let counts = count(&entries);
    for (name, n) in &counts {
        if name == "." || name == ".." {
            check_eq(*n, 1, format!("occurrences of '{name}'"))?;
            continue;
        }
        ensure(
            expected.contains_key(name),
            format!("readdir returned unexpected name {name:?}"),
        )?;
        check_eq(*n, 1, format!("occurrences of {name:?}"))?;
    }
    for name in expected.keys() {
        ensure(
            counts.contains_key(name),
            format!("readdir is missing {name:?}"),
        )?;
    }
    for (name, t) in &entries {
        if let Some(&et) = expected.get(name) {
            ensure(
                *t == et || *t == libc::DT_UNKNOWN,
                format!("d_type of {name:?}: expected {et}, got {t}"),
            )?;
        }
    }
    // Deleting everything leaves just '.' and '..'.
    for (name, t) in &expected {
        let p = d.join(name);
        if *t == libc::DT_DIR {
            rmdir(&p).ctx("rmdir")?;
        } else {
            unlink(&p).ctx("unlink")?;
        }
    }
    check_eq(read_all(&d)?.len(), 2, "entries after deleting everything")
}

fn readdir_modified_during_iteration(c: &Ctx) -> CheckResult {
    let d = c.p("d");
    mkdir(&d, 0o755).ctx("mkdir")?;
    let n = 300;
    for i in 0..n {
        write_file(&d.join(format!("orig{i:04}")), b"", 0o644).ctx("create")?;
    }
    let mut ds = DirStream::open(&d).ctx("opendir")?;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for _ in 0..100 {
        match ds.next().ctx("readdir")? {
            Some((name, _)) => *seen.entry(name).or_insert(0) += 1,
            None => return fail("directory ended after fewer than 100 entries"),
        }
    }
    // Touch some names: remove 50 not-yet-seen and 10 seen originals, add 150 new ones.
    let mut removed = Vec::new();
    for i in (0..n).rev() {
        let name = format!("orig{i:04}");
        if removed.len() < 50 && !seen.contains_key(&name) {
            unlink(&d.join(&name)).ctx("unlink during iteration")?;
            removed.push(name);
        }
    }
    for i in 0..n {
        let name = format!("orig{i:04}");
        if removed.len() < 60 && seen.contains_key(&name) {
            unlink(&d.join(&name)).ctx("unlink during iteration")?;
            removed.push(name);
        }
    }
    for i in 0..150 {
        write_file(&d.join(format!("new{i:04}")), b"", 0o644).ctx("create during iteration")?;
    }
    while let Some((name, _)) = ds.next().ctx("readdir")? {
        *seen.entry(name).or_insert(0) += 1;
    }
    for (name, k) in &seen {
        ensure(
            *k == 1,
            format!("{name:?} returned {k} times during one iteration"),
        )?;
    }
    for i in 0..n {
        let name = format!("orig{i:04}");
        if !removed.contains(&name) {
            ensure(
                seen.contains_key(&name),
                format!("untouched entry {name:?} was skipped by readdir"),
            )?;
        }
    }
    // A fresh iteration sees exactly the current state.
    let now = count(&read_all(&d)?);
    check_eq(
        now.len(),
        n - removed.len() + 150 + 2,
        "entries in a fresh listing",
    )
}

fn readdir_telldir_seekdir(c: &Ctx) -> CheckResult {
    let d = c.p("d");
    mkdir(&d, 0o755).ctx("mkdir")?;
    for i in 0..200 {
        write_file(&d.join(format!("file{i}")), b"", 0o644).ctx("create")?;
    }
    let mut ds = DirStream::open(&d).ctx("opendir")?;
    let mut list = Vec::new(); // (position before entry, name)
    loop {
        let pos = ds.tell();
        match ds.next().ctx("readdir")? {
            Some((name, _)) => list.push((pos, name)),
            None => break,
        }
    }
    check_eq(list.len(), 202, "entry count")?;
    for &i in &[150usize, 0, 77, 201, 1, 100, 199] {
        let (pos, ref name) = list[i];
        ds.seek(pos);
        let got = ds.next().ctx("readdir after seekdir")?;
        check_eq(
            got.map(|g| g.0),
            Some(name.clone()),
            format!("entry after seekdir to the cookie of entry #{i}"),
        )?;
        // And iteration continues in the same order.
        if i + 1 < list.len() {
            let next = ds.next().ctx("readdir")?;
            check_eq(
                next.map(|g| g.0),
                Some(list[i + 1].1.clone()),
                format!("entry following #{i} after seekdir"),
            )?;
        }
    }
    // Cookies stay valid after unrelated entries are removed.
    unlink(&d.join(&list[10].1).clone()).ok();
    let (pos, ref name) = list[120];
    if name != "." && name != ".." && name != &list[10].1 {
        ds.seek(pos);
        let got = ds.next().ctx("readdir")?;
        check_eq(
            got.map(|g| g.0),
            Some(name.clone()),
            "seekdir cookie still valid after unlinking another entry",
        )?;
    }
    ds.rewind();
    let first = ds.next().ctx("readdir after rewinddir")?;
    check_eq(
        first.map(|g| g.0),
        Some(list[0].1.clone()),
        "first entry after rewinddir",
    )
}
