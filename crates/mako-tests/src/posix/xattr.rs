//! Checks for extended attributes (user./trusted./security. namespaces, flags, ERANGE) and POSIX
//! ACLs written in the kernel's binary `system.posix_acl_*` format.

use super::*;
use crate::sys::*;

pub(super) const CHECKS: CheckTable = &[
    ("xattr_user", xattr_user),
    ("xattr_trusted_security", xattr_trusted_security),
    ("xattr_flags_and_erange", xattr_flags_and_erange),
    ("acl_access_named_user", acl_access_named_user),
    ("acl_default_inheritance", acl_default_inheritance),
    ("acl_minimal_folded_into_mode", acl_minimal_folded_into_mode),
];

fn xattr_roundtrip(p: &Path, ns: &str, nofollow: bool) -> CheckResult {
    let small = format!("{ns}.mako_small");
    let big = format!("{ns}.mako_big");
    let empty = format!("{ns}.mako_empty");
    let r = setxattr(p, &small, b"value1", 0, nofollow);
    if let Err(e) = r {
        if e.0 == libc::EOPNOTSUPP {
            return skip(format!("{ns}.* xattrs not supported here ({e})"));
        }
    }
    r.ctx(format!("setxattr {small}"))?;
    check_eq(
        getxattr(p, &small).ctx("getxattr")?,
        b"value1".to_vec(),
        format!("{small} value"),
    )?;
    let bigval = pattern(3000, 21);
    setxattr(p, &big, &bigval, 0, nofollow).ctx(format!("setxattr {big} (3000 bytes)"))?;
    check_eq(
        getxattr(p, &big).ctx("getxattr big")?,
        bigval,
        format!("{big} value"),
    )?;
    setxattr(p, &empty, b"", 0, nofollow).ctx("setxattr empty value")?;
    check_eq(
        getxattr(p, &empty).ctx("getxattr empty")?.len(),
        0,
        "empty value length",
    )?;
    // Overwrite with a shorter value.
    setxattr(p, &small, b"v2", 0, nofollow).ctx("overwrite")?;
    check_eq(
        getxattr(p, &small).ctx("getxattr")?,
        b"v2".to_vec(),
        "value after overwrite",
    )?;
    let names = listxattr(p).ctx("listxattr")?;
    for n in [&small, &big, &empty] {
        check_eq(
            names.iter().filter(|x| *x == n).count(),
            1,
            format!("occurrences of {n} in listxattr {names:?}"),
        )?;
    }
    removexattr(p, &small).ctx("removexattr")?;
    expect_errno(
        getxattr(p, &small),
        &[libc::ENODATA],
        "getxattr after removexattr",
    )?;
    expect_errno(
        removexattr(p, &small),
        &[libc::ENODATA],
        "removexattr of missing attribute",
    )?;
    let names = listxattr(p).ctx("listxattr")?;
    ensure(
        !names.contains(&small),
        format!("{small} still listed after removal: {names:?}"),
    )?;
    removexattr(p, &big).ctx("removexattr big")?;
    removexattr(p, &empty).ctx("removexattr empty")?;
    Ok(())
}

fn xattr_user(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, b"", 0o644).ctx("create")?;
    xattr_roundtrip(&f, "user", false)?;
    mkdir(&c.p("d"), 0o755).ctx("mkdir")?;
    xattr_roundtrip(&c.p("d"), "user", false)?;
    // user.* is not allowed on symlinks (EPERM) by Linux.
    symlink("f", &c.p("l")).ctx("symlink")?;
    expect_errno(
        setxattr(&c.p("l"), "user.x", b"1", 0, true),
        &[libc::EPERM],
        "lsetxattr user.* on a symlink",
    )?;
    // Survives rename.
    setxattr(&f, "user.keep", b"kept", 0, false).ctx("setxattr")?;
    rename(&f, &c.p("g")).ctx("rename")?;
    check_eq(
        getxattr(&c.p("g"), "user.keep").ctx("getxattr after rename")?,
        b"kept".to_vec(),
        "xattr after rename",
    )?;
    expect_errno(
        getxattr(&c.p("g"), "user.none"),
        &[libc::ENODATA],
        "getxattr of missing attribute",
    )?;
    expect_errno(
        getxattr(&c.p("missing"), "user.x"),
        &[libc::ENOENT],
        "getxattr on missing file",
    )?;
    expect_errno(
        setxattr(&c.p("g"), "bogusns.x", b"1", 0, false),
        &[libc::EOPNOTSUPP],
        "setxattr in unknown namespace",
    )
}

fn xattr_trusted_security(c: &Ctx) -> CheckResult {
    need_root("trusted.* xattrs")?;
    let f = c.p("f");
    write_file(&f, b"", 0o644).ctx("create")?;
    xattr_roundtrip(&f, "trusted", false)?;
    xattr_roundtrip(&f, "security", false)?;
    // trusted.* works on symlinks.
    symlink("f", &c.p("l")).ctx("symlink")?;
    setxattr(&c.p("l"), "trusted.onlink", b"L", 0, true).ctx("lsetxattr trusted.* on symlink")?;
    check_eq(
        lget(&c.p("l"), "trusted.onlink").ctx("lgetxattr")?,
        b"L".to_vec(),
        "trusted xattr on symlink",
    )?;
    expect_errno(
        getxattr(&f, "trusted.onlink"),
        &[libc::ENODATA],
        "symlink's xattr is not on the target",
    )?;
    // trusted.* is invisible to unprivileged users.
    setxattr(&f, "trusted.secret", b"s", 0, false).ctx("setxattr")?;
    chmod(&c.dir, 0o755).ctx("chmod")?;
    let fc = relc(c, &f);
    let r = in_child(Some(&cred_b(c)), || {
        let mut buf = [0u8; 4096];
        let n = unsafe { libc::listxattr(fc.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return 100;
        }
        if buf[..n as usize]
            .windows(14)
            .any(|w| w == b"trusted.secret")
        {
            return 101;
        }
        0
    })?;
    check_eq(
        r,
        Ok(()),
        "unprivileged listxattr must not list trusted.* (100 = listxattr failed, 101 = listed)",
    )
}

fn lget(p: &Path, name: &str) -> SysResult<Vec<u8>> {
    let (c, n) = (cstr(p), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(Errno::last());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

fn xattr_flags_and_erange(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, b"", 0o644).ctx("create")?;
    let r = setxattr(&f, "user.a", b"12345678", libc::XATTR_CREATE, false);
    unsupported_skip(r, "user.* xattrs")?.ctx("XATTR_CREATE on new name")?;
    expect_errno(
        setxattr(&f, "user.a", b"x", libc::XATTR_CREATE, false),
        &[libc::EEXIST],
        "XATTR_CREATE on existing",
    )?;
    expect_errno(
        setxattr(&f, "user.b", b"x", libc::XATTR_REPLACE, false),
        &[libc::ENODATA],
        "XATTR_REPLACE on missing",
    )?;
    setxattr(&f, "user.a", b"replaced", libc::XATTR_REPLACE, false)
        .ctx("XATTR_REPLACE on existing")?;
    check_eq(
        getxattr(&f, "user.a").ctx("getxattr")?,
        b"replaced".to_vec(),
        "value after XATTR_REPLACE",
    )?;
    // Size query and ERANGE.
    check_eq(
        getxattr_raw(&f, "user.a", &mut []).ctx("getxattr size query")?,
        8,
        "size query returns value length",
    )?;
    expect_errno(
        getxattr_raw(&f, "user.a", &mut [0u8; 4]),
        &[libc::ERANGE],
        "getxattr with too-small buffer",
    )?;
    check_eq(
        getxattr_raw(&f, "user.a", &mut [0u8; 8]).ctx("getxattr exact buffer")?,
        8,
        "exact-size buffer",
    )?;
    setxattr(&f, "user.second", b"", 0, false).ctx("setxattr")?;
    let need = listxattr_raw(&f, &mut []).ctx("listxattr size query")?;
    ensure(
        need >= "user.a\0user.second\0".len(),
        format!("listxattr size query too small: {need}"),
    )?;
    expect_errno(
        listxattr_raw(&f, &mut [0u8; 3]),
        &[libc::ERANGE],
        "listxattr with too-small buffer",
    )?;
    // A value of several KiB and a long name.
    let v = pattern(3500, 22);
    setxattr(&f, "user.big", &v, 0, false).ctx("setxattr 3500-byte value")?;
    check_eq(
        getxattr(&f, "user.big").ctx("getxattr")?,
        v,
        "3500-byte value",
    )?;
    let longname = format!("user.{}", "n".repeat(250));
    setxattr(&f, &longname, b"1", 0, false).ctx("setxattr with 255-byte name")?;
    let toolong = format!("user.{}", "n".repeat(251));
    expect_errno(
        setxattr(&f, &toolong, b"1", 0, false),
        &[libc::ERANGE],
        "setxattr with 256-byte name",
    )?;
    expect_errno(
        setxattr(&f, "user.huge", &vec![1u8; 70000], 0, false),
        &[libc::E2BIG, libc::ENOSPC, libc::ERANGE],
        "setxattr value > 64 KiB",
    )
}

// --- POSIX ACL binary format (linux/posix_acl_xattr.h) --------------------------------------

const ACL_VERSION: u32 = 2;
pub(crate) const ACL_USER_OBJ: u16 = 0x01;
pub(crate) const ACL_USER: u16 = 0x02;
pub(crate) const ACL_GROUP_OBJ: u16 = 0x04;
pub(crate) const ACL_GROUP: u16 = 0x08;
pub(crate) const ACL_MASK: u16 = 0x10;
pub(crate) const ACL_OTHER: u16 = 0x20;
const ACL_UNDEFINED_ID: u32 = u32::MAX;

/// Encodes ACL entries (tag, perm, id) in kernel xattr format; entries must be in tag/id order.
pub(crate) fn acl_encode(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = ACL_VERSION.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// Decodes kernel-format ACL xattr bytes.
pub(crate) fn acl_decode(b: &[u8]) -> Option<Vec<(u16, u16, u32)>> {
    if b.len() < 4
        || (b.len() - 4) & 7 != 0
        || u32::from_le_bytes(b[..4].try_into().ok()?) != ACL_VERSION
    {
        return None;
    }
    Some(
        b[4..]
            .chunks(8)
            .map(|e| {
                (
                    u16::from_le_bytes([e[0], e[1]]),
                    u16::from_le_bytes([e[2], e[3]]),
                    u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
                )
            })
            .collect(),
    )
}

fn set_acl(p: &Path, name: &str, entries: &[(u16, u16, u32)]) -> CheckResult {
    let r = setxattr(p, name, &acl_encode(entries), 0, false);
    unsupported_skip(r, "POSIX ACLs")?.ctx(format!("setxattr {name}"))
}

fn acl_access_named_user(c: &Ctx) -> CheckResult {
    need_root("switching uid to test ACL access")?;
    let f = c.p("f");
    write_file(&f, b"secret", 0o600).ctx("create")?;
    chmod(&f, 0o600).ctx("chmod")?;
    let acl = [
        (ACL_USER_OBJ, 6, ACL_UNDEFINED_ID),
        (ACL_USER, 4, UID_A),
        (ACL_GROUP_OBJ, 0, ACL_UNDEFINED_ID),
        (ACL_GROUP, 6, GID_SHARED),
        (ACL_MASK, 4, ACL_UNDEFINED_ID),
        (ACL_OTHER, 0, ACL_UNDEFINED_ID),
    ];
    set_acl(&f, "system.posix_acl_access", &acl)?;
    let back = getxattr(&f, "system.posix_acl_access").ctx("getxattr system.posix_acl_access")?;
    check_eq(acl_decode(&back), Some(acl.to_vec()), "ACL read back")?;
    check_mode(
        perms(&stat(&f).ctx("stat")?),
        0o640,
        "mode group bits mirror the ACL mask",
    )?;
    let fc = relc(c, &f);
    let acc = |mode| {
        let fc = fc.clone();
        move || {
            if unsafe { libc::access(fc.as_ptr(), mode) } == 0 {
                0
            } else {
                Errno::last().0
            }
        }
    };
    check_eq(
        in_child(Some(&cred_a(c)), acc(libc::R_OK))?,
        Ok(()),
        "access(R_OK) as the ACL's named user",
    )?;
    let fc2 = fc.clone();
    let r = in_child(Some(&cred_a(c)), move || {
        child_code(cvt(unsafe { libc::open(fc2.as_ptr(), libc::O_RDONLY) }))
    })?;
    check_eq(r, Ok(()), "open O_RDONLY as the ACL's named user")?;
    expect_errno(
        in_child(Some(&cred_a(c)), acc(libc::W_OK))?,
        &[libc::EACCES],
        "access(W_OK) as named user with r-- entry",
    )?;
    expect_errno(
        in_child(Some(&cred_b(c)), acc(libc::R_OK))?,
        &[libc::EACCES],
        "access(R_OK) as a user not in the ACL",
    )?;
    // The named group gets rw-, masked to r--.
    let grp = cred(c, UID_B, GID_B, &[GID_SHARED]);
    check_eq(
        in_child(Some(&grp), acc(libc::R_OK))?,
        Ok(()),
        "access(R_OK) via named group entry",
    )?;
    expect_errno(
        in_child(Some(&grp), acc(libc::W_OK))?,
        &[libc::EACCES],
        "access(W_OK) via named group is masked",
    )?;
    // chmod rewrites the mask.
    chmod(&f, 0o660).ctx("chmod 660")?;
    check_eq(
        in_child(Some(&grp), acc(libc::W_OK))?,
        Ok(()),
        "access(W_OK) via named group after widening mask by chmod",
    )?;
    // Removing the ACL restores plain mode semantics.
    removexattr(&f, "system.posix_acl_access").ctx("remove ACL")?;
    expect_errno(
        in_child(Some(&cred_a(c)), acc(libc::R_OK))?,
        &[libc::EACCES],
        "access(R_OK) after removing the ACL",
    )
}

/// A minimal access ACL (owner, group, other) says no more than the mode: the file system
/// folds it into the mode bits and stores no ACL (`ls -l` shows no `+`, getxattr ENODATA),
/// also when it replaces a full ACL.
fn acl_minimal_folded_into_mode(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, b"x", 0o644).ctx("create")?;
    chmod(&f, 0o644).ctx("chmod 644")?;
    let minimal = [
        (ACL_USER_OBJ, 6, ACL_UNDEFINED_ID),
        (ACL_GROUP_OBJ, 4, ACL_UNDEFINED_ID),
        (ACL_OTHER, 0, ACL_UNDEFINED_ID),
    ];
    let stored = |what: &str| -> CheckResult {
        expect_errno(
            getxattr(&f, "system.posix_acl_access"),
            &[libc::ENODATA],
            format!("getxattr system.posix_acl_access after {what}"),
        )?;
        let names = listxattr(&f).ctx("listxattr")?;
        ensure(
            !names.iter().any(|n| n == "system.posix_acl_access"),
            format!("listxattr after {what} names an access ACL: {names:?}"),
        )
    };
    set_acl(&f, "system.posix_acl_access", &minimal)?;
    check_mode(
        perms(&stat(&f).ctx("stat")?),
        0o640,
        "mode after a minimal ACL",
    )?;
    stored("a minimal ACL")?;
    // A full ACL is stored; a minimal one set over it removes it.
    let full = [
        (ACL_USER_OBJ, 7, ACL_UNDEFINED_ID),
        (ACL_USER, 4, UID_A),
        (ACL_GROUP_OBJ, 4, ACL_UNDEFINED_ID),
        (ACL_MASK, 4, ACL_UNDEFINED_ID),
        (ACL_OTHER, 4, ACL_UNDEFINED_ID),
    ];
    set_acl(&f, "system.posix_acl_access", &full)?;
    let back = getxattr(&f, "system.posix_acl_access").ctx("getxattr of a full ACL")?;
    check_eq(acl_decode(&back), Some(full.to_vec()), "full ACL read back")?;
    set_acl(&f, "system.posix_acl_access", &minimal)?;
    check_mode(
        perms(&stat(&f).ctx("stat")?),
        0o640,
        "mode after a minimal ACL over a full one",
    )?;
    stored("a minimal ACL over a full one")
}

fn acl_default_inheritance(c: &Ctx) -> CheckResult {
    let d = c.p("d");
    mkdir(&d, 0o755).ctx("mkdir")?;
    chmod(&d, 0o755).ctx("chmod")?;
    let dacl = [
        (ACL_USER_OBJ, 7, ACL_UNDEFINED_ID),
        (ACL_USER, 7, UID_A),
        (ACL_GROUP_OBJ, 5, ACL_UNDEFINED_ID),
        (ACL_MASK, 7, ACL_UNDEFINED_ID),
        (ACL_OTHER, 0, ACL_UNDEFINED_ID),
    ];
    set_acl(&d, "system.posix_acl_default", &dacl)?;
    check_eq(
        acl_decode(&getxattr(&d, "system.posix_acl_default").ctx("get default ACL")?),
        Some(dacl.to_vec()),
        "default ACL read back",
    )?;
    // New file: access ACL derived from the default, masked by the create mode (umask ignored).
    let f = d.join("f");
    let fd =
        open(&f, libc::O_CREAT | libc::O_WRONLY, 0o666).ctx("create in dir with default ACL")?;
    drop(fd);
    let st = stat(&f).ctx("stat")?;
    check_mode(
        perms(&st),
        0o660,
        "mode of new file (0666 create mode & default ACL; umask ignored)",
    )?;
    let facl = acl_decode(&getxattr(&f, "system.posix_acl_access").ctx("new file's access ACL")?);
    let expect_f = vec![
        (ACL_USER_OBJ, 6, ACL_UNDEFINED_ID),
        (ACL_USER, 7, UID_A),
        (ACL_GROUP_OBJ, 5, ACL_UNDEFINED_ID),
        (ACL_MASK, 6, ACL_UNDEFINED_ID),
        (ACL_OTHER, 0, ACL_UNDEFINED_ID),
    ];
    check_eq(facl, Some(expect_f), "inherited access ACL of new file")?;
    expect_errno(
        getxattr(&f, "system.posix_acl_default"),
        &[libc::ENODATA],
        "files get no default ACL",
    )?;
    // New subdirectory: inherits both the default and an access ACL.
    let sd = d.join("sub");
    mkdir(&sd, 0o777).ctx("mkdir in dir with default ACL")?;
    check_eq(
        acl_decode(&getxattr(&sd, "system.posix_acl_default").ctx("subdir default ACL")?),
        Some(dacl.to_vec()),
        "subdir inherits the default ACL",
    )?;
    let sacl = acl_decode(&getxattr(&sd, "system.posix_acl_access").ctx("subdir access ACL")?);
    check_eq(sacl, Some(dacl.to_vec()), "subdir access ACL")?;
    check_mode(perms(&stat(&sd).ctx("stat")?), 0o770, "subdir mode")?;
    if sys::is_root() {
        let fc = relc(c, &f);
        let r = in_child(Some(&cred_a(c)), move || {
            child_code(cvt(unsafe { libc::open(fc.as_ptr(), libc::O_WRONLY) }))
        })?;
        check_eq(
            r,
            Ok(()),
            "named user of the inherited ACL can open the new file for writing",
        )?;
    }
    Ok(())
}
