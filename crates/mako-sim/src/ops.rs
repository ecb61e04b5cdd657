//! The POSIX operations of the workload, as data (`Op`), and how one runs on a node's
//! `FileSystem` (`exec`). Paths are resolved on the node that runs the operation, one
//! `lookup` per component, as the kernel would: name lookups are part of what is
//! checked. What comes back (`Outcome`) is plain data the model compares.

use mako_format::inode::Timestamp;
use mako_fs::fs::{Attr, Ctx, FileSystem, SetAttr, TimeSet, ROOT_INO};
use std::fmt;

/// A path from the root, one name per component (empty: the root).
pub type Path = Vec<Vec<u8>>;

/// Renders a path as `/a/b`.
pub fn show_path(p: &[Vec<u8>]) -> String {
    if p.is_empty() {
        return "/".into();
    }
    p.iter()
        .map(|c| format!("/{}", String::from_utf8_lossy(c)))
        .collect()
}

pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Create {
        parent: Path,
        name: Vec<u8>,
        perm: u32,
        exclusive: bool,
    },
    Mkdir {
        parent: Path,
        name: Vec<u8>,
        perm: u32,
    },
    Symlink {
        parent: Path,
        name: Vec<u8>,
        target: Vec<u8>,
    },
    Link {
        path: Path,
        parent: Path,
        name: Vec<u8>,
    },
    Unlink {
        path: Path,
    },
    Rmdir {
        path: Path,
    },
    Rename {
        path: Path,
        parent: Path,
        name: Vec<u8>,
        flags: u32,
    },
    Readlink {
        path: Path,
    },
    /// Write `len` bytes of the pattern `data_seed` at `offset`.
    Write {
        path: Path,
        offset: u64,
        len: u64,
        data_seed: u64,
    },
    Read {
        path: Path,
        offset: u64,
        len: u64,
    },
    Truncate {
        path: Path,
        size: u64,
    },
    Chmod {
        path: Path,
        perm: u32,
    },
    /// utimensat with explicit times.
    Utimes {
        path: Path,
        atime: Timestamp,
        mtime: Timestamp,
    },
    SetXattr {
        path: Path,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: i32,
    },
    GetXattr {
        path: Path,
        name: Vec<u8>,
    },
    ListXattr {
        path: Path,
    },
    RemoveXattr {
        path: Path,
        name: Vec<u8>,
    },
    Fsync {
        path: Path,
    },
    Readdir {
        path: Path,
    },
    Stat {
        path: Path,
    },
    /// lseek with SEEK_DATA (3) or SEEK_HOLE (4).
    Lseek {
        path: Path,
        offset: u64,
        whence: i32,
    },
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = |s: &[u8]| String::from_utf8_lossy(s).into_owned();
        let p = |parent: &Path, name: &[u8]| {
            let mut v = parent.clone();
            v.push(name.to_vec());
            show_path(&v)
        };
        match self {
            Op::Create {
                parent,
                name,
                perm,
                exclusive,
            } => write!(
                f,
                "create {} mode {perm:o}{}",
                p(parent, name),
                if *exclusive { " O_EXCL" } else { "" }
            ),
            Op::Mkdir { parent, name, perm } => {
                write!(f, "mkdir {} mode {perm:o}", p(parent, name))
            }
            Op::Symlink {
                parent,
                name,
                target,
            } => {
                let t = n(target);
                if t.len() > 24 {
                    write!(
                        f,
                        "symlink {} -> {}... ({} bytes)",
                        p(parent, name),
                        &t[..16],
                        t.len()
                    )
                } else {
                    write!(f, "symlink {} -> {t}", p(parent, name))
                }
            }
            Op::Link { path, parent, name } => {
                write!(f, "link {} {}", show_path(path), p(parent, name))
            }
            Op::Unlink { path } => write!(f, "unlink {}", show_path(path)),
            Op::Rmdir { path } => write!(f, "rmdir {}", show_path(path)),
            Op::Rename {
                path,
                parent,
                name,
                flags,
            } => write!(
                f,
                "rename {} {}{}",
                show_path(path),
                p(parent, name),
                match *flags {
                    RENAME_NOREPLACE => " RENAME_NOREPLACE",
                    RENAME_EXCHANGE => " RENAME_EXCHANGE",
                    _ => "",
                }
            ),
            Op::Readlink { path } => write!(f, "readlink {}", show_path(path)),
            Op::Write {
                path,
                offset,
                len,
                data_seed,
            } => write!(
                f,
                "write {} [{offset}, +{len}) pattern {data_seed}",
                show_path(path)
            ),
            Op::Read { path, offset, len } => {
                write!(f, "read {} [{offset}, +{len})", show_path(path))
            }
            Op::Truncate { path, size } => write!(f, "truncate {} to {size}", show_path(path)),
            Op::Chmod { path, perm } => write!(f, "chmod {perm:o} {}", show_path(path)),
            Op::Utimes { path, atime, mtime } => write!(
                f,
                "utimes {} atime {}.{:09} mtime {}.{:09}",
                show_path(path),
                atime.sec,
                atime.nsec,
                mtime.sec,
                mtime.nsec
            ),
            Op::SetXattr {
                path,
                name,
                value,
                flags,
            } => write!(
                f,
                "setxattr {} {} ({} bytes, flags {flags})",
                show_path(path),
                n(name),
                value.len()
            ),
            Op::GetXattr { path, name } => write!(f, "getxattr {} {}", show_path(path), n(name)),
            Op::ListXattr { path } => write!(f, "listxattr {}", show_path(path)),
            Op::RemoveXattr { path, name } => {
                write!(f, "removexattr {} {}", show_path(path), n(name))
            }
            Op::Fsync { path } => write!(f, "fsync {}", show_path(path)),
            Op::Readdir { path } => write!(f, "readdir {}", show_path(path)),
            Op::Stat { path } => write!(f, "stat {}", show_path(path)),
            Op::Lseek {
                path,
                offset,
                whence,
            } => write!(
                f,
                "lseek {} {offset} {}",
                show_path(path),
                if *whence == libc::SEEK_DATA {
                    "SEEK_DATA"
                } else {
                    "SEEK_HOLE"
                }
            ),
        }
    }
}

/// The attributes the model checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttrView {
    pub ino: u64,
    pub mode: u32,
    pub size: u64,
    pub nlink: u32,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
}

impl From<&Attr> for AttrView {
    fn from(a: &Attr) -> Self {
        AttrView {
            ino: a.ino,
            mode: a.mode,
            size: a.size,
            nlink: a.nlink,
            mtime: a.mtime,
            ctime: a.ctime,
        }
    }
}

/// What an operation returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Unit,
    Attr(AttrView),
    Bytes(Vec<u8>),
    /// listxattr: the names, sorted.
    Names(Vec<Vec<u8>>),
    /// readdir: every entry with its inode number, `.` and `..` included, by name.
    Entries(Vec<(Vec<u8>, u64)>),
    Count(u64),
    Offset(u64),
}

/// An error as the caller sees it: the errno, and the core's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError {
    pub errno: i32,
    pub message: String,
}

pub type Outcome = Result<Value, OpError>;

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Unit => write!(f, "ok"),
            Value::Attr(a) => write!(
                f,
                "ino {} mode {:o} size {} nlink {} mtime {}.{:09} ctime {}.{:09}",
                a.ino,
                a.mode,
                a.size,
                a.nlink,
                a.mtime.sec,
                a.mtime.nsec,
                a.ctime.sec,
                a.ctime.nsec
            ),
            Value::Bytes(b) => write!(f, "{} bytes", b.len()),
            Value::Names(n) => write!(
                f,
                "[{}]",
                n.iter()
                    .map(|x| String::from_utf8_lossy(x).into_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Value::Entries(e) => write!(
                f,
                "[{}]",
                e.iter()
                    .map(|(n, i)| format!("{}={i}", String::from_utf8_lossy(n)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Value::Count(n) => write!(f, "{n}"),
            Value::Offset(o) => write!(f, "offset {o}"),
        }
    }
}

/// Renders an outcome for a failure report.
pub fn show_outcome(o: &Outcome) -> String {
    match o {
        Ok(v) => v.to_string(),
        Err(e) => format!("{} ({})", errno_name(e.errno), e.message),
    }
}

pub fn errno_name(e: i32) -> String {
    let name = match e {
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::EINVAL => "EINVAL",
        libc::EPERM => "EPERM",
        libc::ENODATA => "ENODATA",
        libc::ENXIO => "ENXIO",
        libc::EIO => "EIO",
        libc::ESTALE => "ESTALE",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => return format!("errno {e}"),
    };
    name.into()
}

/// Deterministic data of a write: `len` bytes of a stream seeded by `seed`, never
/// all zero (so a lost write never reads like a hole).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x as u8) | 1
        })
        .collect()
}

fn err(e: mako_fs::error::FsError) -> OpError {
    OpError {
        errno: e.errno(),
        message: e.to_string(),
    }
}

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};
const UMASK: u32 = 0o022;
/// Entries asked of one readdir call: small, so listings take several calls and
/// resume from cookies.
const READDIR_BATCH: usize = 5;

/// Resolve `path` to an inode number by looking up each component.
pub fn resolve(fs: &FileSystem, path: &[Vec<u8>]) -> Result<u64, OpError> {
    let mut ino = ROOT_INO;
    for c in path {
        ino = fs.lookup(ino, c).map_err(err)?.ino;
    }
    Ok(ino)
}

/// Run `op` on `fs`.
pub fn exec(fs: &FileSystem, op: &Op) -> Outcome {
    let attr = |a: Attr| Value::Attr(AttrView::from(&a));
    match op {
        Op::Create {
            parent,
            name,
            perm,
            exclusive,
        } => {
            let p = resolve(fs, parent)?;
            fs.create(CTX, p, name, *perm, UMASK, *exclusive)
                .map(attr)
                .map_err(err)
        }
        Op::Mkdir { parent, name, perm } => {
            let p = resolve(fs, parent)?;
            fs.mkdir(CTX, p, name, *perm, UMASK).map(attr).map_err(err)
        }
        Op::Symlink {
            parent,
            name,
            target,
        } => {
            let p = resolve(fs, parent)?;
            fs.symlink(CTX, p, name, target).map(attr).map_err(err)
        }
        Op::Link { path, parent, name } => {
            let ino = resolve(fs, path)?;
            let p = resolve(fs, parent)?;
            fs.link(ino, p, name).map(attr).map_err(err)
        }
        Op::Unlink { path } => {
            let (p, name) = split(path);
            let p = resolve(fs, p)?;
            fs.unlink(p, name).map(|_| Value::Unit).map_err(err)
        }
        Op::Rmdir { path } => {
            let (p, name) = split(path);
            let p = resolve(fs, p)?;
            fs.rmdir(p, name).map(|_| Value::Unit).map_err(err)
        }
        Op::Rename {
            path,
            parent,
            name,
            flags,
        } => {
            let (p1, n1) = split(path);
            let p1 = resolve(fs, p1)?;
            let p2 = resolve(fs, parent)?;
            fs.rename(p1, n1, p2, name, *flags)
                .map(|_| Value::Unit)
                .map_err(err)
        }
        Op::Readlink { path } => {
            let ino = resolve(fs, path)?;
            fs.readlink(ino).map(Value::Bytes).map_err(err)
        }
        Op::Write {
            path,
            offset,
            len,
            data_seed,
        } => {
            let ino = resolve(fs, path)?;
            let data = pattern(*data_seed, *len as usize);
            fs.write(ino, *offset, &data, false)
                .map(|n| Value::Count(n as u64))
                .map_err(err)
        }
        Op::Read { path, offset, len } => {
            let ino = resolve(fs, path)?;
            fs.read(ino, *offset, *len as u32)
                .map(Value::Bytes)
                .map_err(err)
        }
        Op::Truncate { path, size } => {
            let ino = resolve(fs, path)?;
            fs.setattr(
                ino,
                SetAttr {
                    size: Some(*size),
                    ..SetAttr::default()
                },
            )
            .map(|_| Value::Unit)
            .map_err(err)
        }
        Op::Chmod { path, perm } => {
            let ino = resolve(fs, path)?;
            fs.setattr(
                ino,
                SetAttr {
                    mode: Some(*perm),
                    ..SetAttr::default()
                },
            )
            .map(|_| Value::Unit)
            .map_err(err)
        }
        Op::Utimes { path, atime, mtime } => {
            let ino = resolve(fs, path)?;
            fs.setattr(
                ino,
                SetAttr {
                    atime: Some(TimeSet::At(*atime)),
                    mtime: Some(TimeSet::At(*mtime)),
                    ..SetAttr::default()
                },
            )
            .map(|_| Value::Unit)
            .map_err(err)
        }
        Op::SetXattr {
            path,
            name,
            value,
            flags,
        } => {
            let ino = resolve(fs, path)?;
            fs.setxattr(ino, name, value, *flags)
                .map(|_| Value::Unit)
                .map_err(err)
        }
        Op::GetXattr { path, name } => {
            let ino = resolve(fs, path)?;
            fs.getxattr(ino, name).map(Value::Bytes).map_err(err)
        }
        Op::ListXattr { path } => {
            let ino = resolve(fs, path)?;
            let raw = fs.listxattr(ino).map_err(err)?;
            let mut names: Vec<Vec<u8>> = raw
                .split(|b| *b == 0)
                .filter(|n| !n.is_empty())
                .map(|n| n.to_vec())
                .collect();
            names.sort();
            Ok(Value::Names(names))
        }
        Op::RemoveXattr { path, name } => {
            let ino = resolve(fs, path)?;
            fs.removexattr(ino, name).map(|_| Value::Unit).map_err(err)
        }
        Op::Fsync { path } => {
            let ino = resolve(fs, path)?;
            fs.fsync(ino, false).map(|_| Value::Unit).map_err(err)
        }
        Op::Readdir { path } => {
            let ino = resolve(fs, path)?;
            let mut out = Vec::new();
            let mut after = 0;
            loop {
                let batch = fs.readdir(ino, after, READDIR_BATCH).map_err(err)?;
                let Some(last) = batch.last() else { break };
                if last.cookie <= after {
                    return Err(OpError {
                        errno: libc::EIO,
                        message: format!(
                            "readdir cookie went backwards: {} after {after}",
                            last.cookie
                        ),
                    });
                }
                after = last.cookie;
                out.extend(batch.into_iter().map(|e| (e.name, e.ino)));
                if out.len() > 100_000 {
                    return Err(OpError {
                        errno: libc::EIO,
                        message: "readdir does not end".into(),
                    });
                }
            }
            out.sort();
            Ok(Value::Entries(out))
        }
        Op::Stat { path } => match path.split_last() {
            // As the kernel's stat(2) of a path: the attributes come with the lookup
            // of its last name (FUSE's LOOKUP reply), one operation, not a lookup and
            // then a separate getattr that a rename can fall between.
            Some((last, parent)) => {
                let p = resolve(fs, parent)?;
                fs.lookup(p, last).map(attr).map_err(err)
            }
            None => fs.getattr(ROOT_INO).map(attr).map_err(err),
        },
        Op::Lseek {
            path,
            offset,
            whence,
        } => {
            let ino = resolve(fs, path)?;
            fs.lseek(ino, *offset, *whence)
                .map(Value::Offset)
                .map_err(err)
        }
    }
}

/// A path's parent and last name (the root has neither: callers never pass it).
pub fn split(path: &[Vec<u8>]) -> (&[Vec<u8>], &[u8]) {
    let (last, parent) = path.split_last().expect("a path below the root");
    (parent, last)
}
