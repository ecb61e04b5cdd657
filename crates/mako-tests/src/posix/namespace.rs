//! Checks for the namespace: open/create flags, mknod, mkdir/rmdir, unlink, symlink/readlink,
//! link and rename (incl. renameat2 flags).

use super::*;
use crate::sys::*;

pub(super) const CHECKS: CheckTable = &[
    ("open_creat_excl", open_creat_excl),
    ("open_trunc", open_trunc),
    ("open_append", open_append),
    ("open_errors", open_errors),
    ("mknod_fifo_socket", mknod_fifo_socket),
    ("mknod_devices", mknod_devices),
    ("mkdir_rmdir", mkdir_rmdir),
    ("unlink", unlink_check),
    ("symlink_readlink", symlink_readlink),
    ("symlink_loop", symlink_loop),
    ("link", link_check),
    ("rename_file", rename_file),
    ("rename_dir_over_dir", rename_dir_over_dir),
    ("rename_type_mismatch", rename_type_mismatch),
    ("rename_into_own_subtree", rename_into_own_subtree),
    ("rename_noreplace", rename_noreplace),
    ("rename_exchange", rename_exchange),
    ("rename_whiteout", rename_whiteout),
    ("rename_dir_between_parents", rename_dir_between_parents),
];

const RW: libc::c_int = libc::O_RDWR;
const CREAT: libc::c_int = libc::O_CREAT;

fn open_creat_excl(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    let fd = open(&f, CREAT | libc::O_EXCL | RW, 0o644).ctx("O_CREAT|O_EXCL on new name")?;
    pwrite_all(&fd, b"abc", 0).ctx("write")?;
    drop(fd);
    expect_errno(
        open(&f, CREAT | libc::O_EXCL | RW, 0o644),
        &[libc::EEXIST],
        "O_CREAT|O_EXCL on existing file",
    )?;
    check_eq(
        read_file(&f).ctx("read")?,
        b"abc".to_vec(),
        "existing file untouched by failed O_EXCL",
    )?;
    open(&f, CREAT | RW, 0o644).ctx("O_CREAT without O_EXCL on existing file")?;
    check_eq(
        read_file(&f).ctx("read")?,
        b"abc".to_vec(),
        "O_CREAT without O_TRUNC keeps data",
    )?;
    symlink("nowhere", &c.p("dangling")).ctx("symlink")?;
    expect_errno(
        open(&c.p("dangling"), CREAT | libc::O_EXCL | RW, 0o644),
        &[libc::EEXIST],
        "O_CREAT|O_EXCL on dangling symlink",
    )?;
    check_eq(
        lstat(&c.p("nowhere")).map(|_| ()),
        Err(Errno(libc::ENOENT)),
        "O_EXCL must not follow the dangling link",
    )?;
    // O_CREAT through a dangling symlink (no O_EXCL) creates the target.
    open(&c.p("dangling"), CREAT | RW, 0o644).ctx("O_CREAT through dangling symlink")?;
    check_mode(
        ftype(&lstat(&c.p("nowhere")).ctx("lstat created target")?),
        libc::S_IFREG,
        "target created via symlink",
    )?;
    mkdir(&c.p("d"), 0o755).ctx("mkdir")?;
    expect_errno(
        open(&c.p("d"), CREAT | libc::O_EXCL | RW, 0o644),
        &[libc::EEXIST],
        "O_CREAT|O_EXCL on a directory",
    )?;
    expect_errno(
        open(&c.p("missing/f"), CREAT | RW, 0o644),
        &[libc::ENOENT],
        "O_CREAT in missing directory",
    )
}

fn open_trunc(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, &pattern(10000, 3), 0o644).ctx("create")?;
    let fd = open(&f, libc::O_TRUNC | libc::O_WRONLY, 0).ctx("open O_TRUNC")?;
    check_eq(
        fstat(&fd).ctx("fstat")?.st_size,
        0,
        "size right after O_TRUNC",
    )?;
    pwrite_all(&fd, b"new", 0).ctx("write")?;
    drop(fd);
    check_eq(
        read_file(&f).ctx("read")?,
        b"new".to_vec(),
        "content after O_TRUNC + write",
    )?;
    let fd = open(&f, libc::O_TRUNC | libc::O_RDONLY, 0)
        .ctx("open O_TRUNC|O_RDONLY (Linux truncates)")?;
    drop(fd);
    check_eq(
        stat(&f).ctx("stat")?.st_size,
        0,
        "O_TRUNC|O_RDONLY truncates on Linux",
    )
}

fn open_append(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, b"0123456789", 0o644).ctx("create")?;
    let fd = open(&f, libc::O_APPEND | libc::O_WRONLY, 0).ctx("open O_APPEND")?;
    lseek(&fd, 0, libc::SEEK_SET).ctx("lseek 0")?;
    write_all(&fd, b"AB").ctx("write")?;
    check_eq(
        lseek(&fd, 0, libc::SEEK_CUR).ctx("lseek cur")?,
        12,
        "offset after O_APPEND write",
    )?;
    lseek(&fd, 3, libc::SEEK_SET).ctx("lseek 3")?;
    write_all(&fd, b"CD").ctx("write")?;
    // Another descriptor extends the file; the appender must still write at the new end.
    let other = open(&f, libc::O_WRONLY, 0).ctx("open second fd")?;
    pwrite_all(&other, b"XYZ", 14).ctx("pwrite via second fd")?;
    write_all(&fd, b"EF").ctx("write")?;
    check_eq(
        read_file(&f).ctx("read")?,
        b"0123456789ABCDXYZEF".to_vec(),
        "O_APPEND writes always land at EOF",
    )
}

fn open_errors(c: &Ctx) -> CheckResult {
    expect_errno(
        open(&c.p("missing"), RW, 0),
        &[libc::ENOENT],
        "open missing without O_CREAT",
    )?;
    mkdir(&c.p("d"), 0o755).ctx("mkdir")?;
    expect_errno(
        open(&c.p("d"), libc::O_WRONLY, 0),
        &[libc::EISDIR],
        "open directory O_WRONLY",
    )?;
    expect_errno(
        open(&c.p("d"), RW, 0),
        &[libc::EISDIR],
        "open directory O_RDWR",
    )?;
    open(&c.p("d"), libc::O_RDONLY | libc::O_DIRECTORY, 0).ctx("open directory O_DIRECTORY")?;
    write_file(&c.p("f"), b"", 0o644).ctx("create")?;
    expect_errno(
        open(&c.p("f"), libc::O_RDONLY | libc::O_DIRECTORY, 0),
        &[libc::ENOTDIR],
        "O_DIRECTORY on a file",
    )?;
    expect_errno(
        open(&c.p("f/x"), libc::O_RDONLY, 0),
        &[libc::ENOTDIR],
        "open through a file",
    )?;
    expect_errno(
        open(&c.p("f/x"), CREAT | RW, 0o644),
        &[libc::ENOTDIR],
        "create under a file",
    )?;
    expect_errno(
        open(&c.p("d"), libc::O_RDONLY | CREAT, 0o644),
        &[libc::EISDIR],
        "O_CREAT on a directory",
    )
}

fn mknod_fifo_socket(c: &Ctx) -> CheckResult {
    let p = c.p("fifo");
    mknod(&p, libc::S_IFIFO | 0o640, 0).ctx("mknod fifo")?;
    let st = lstat(&p).ctx("lstat fifo")?;
    check_mode(ftype(&st), libc::S_IFIFO, "fifo type")?;
    check_mode(
        perms(&st),
        0o640 & !current_umask(),
        "fifo permission bits (0640 minus umask)",
    )?;
    // A fifo opened O_RDWR|O_NONBLOCK works without a peer and passes data.
    let fd = open(&p, libc::O_RDWR | libc::O_NONBLOCK, 0).ctx("open fifo O_RDWR")?;
    write_all(&fd, b"ping").ctx("write fifo")?;
    let mut buf = [0u8; 4];
    check_eq(
        read(&fd, &mut buf).ctx("read fifo")?,
        4,
        "bytes read from fifo",
    )?;
    check_eq(&buf, b"ping", "fifo data")?;
    expect_errno(
        mknod(&p, libc::S_IFIFO | 0o600, 0),
        &[libc::EEXIST],
        "mknod over existing name",
    )?;
    // Unix socket by mknod and by bind.
    let s = c.p("sock");
    mknod(&s, libc::S_IFSOCK | 0o600, 0).ctx("mknod socket")?;
    check_mode(
        ftype(&lstat(&s).ctx("lstat")?),
        libc::S_IFSOCK,
        "mknod socket type",
    )?;
    let sp = c.p("bound.sock");
    let bytes = sp.as_os_str().as_encoded_bytes();
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Ok(()); // path too long for sun_path; mknod case above covered the type
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in bytes.iter().enumerate() {
        addr.sun_path[i] = *b as libc::c_char;
    }
    let sock = Fd::from_raw(
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) }).ctx("socket")?,
    );
    cvt(unsafe {
        libc::bind(
            sock.raw(),
            &addr as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_un>() as u32,
        )
    })
    .ctx("bind unix socket")?;
    check_mode(
        ftype(&lstat(&sp).ctx("lstat bound socket")?),
        libc::S_IFSOCK,
        "bound socket type",
    )
}

fn mknod_devices(c: &Ctx) -> CheckResult {
    need_root("mknod of device nodes")?;
    let ch = c.p("null");
    mknod(&ch, libc::S_IFCHR | 0o666, libc::makedev(1, 3)).ctx("mknod char 1:3")?;
    let st = lstat(&ch).ctx("lstat char")?;
    check_mode(ftype(&st), libc::S_IFCHR, "char device type")?;
    check_eq(
        (libc::major(st.st_rdev), libc::minor(st.st_rdev)),
        (1, 3),
        "char device (major, minor)",
    )?;
    let bl = c.p("blk");
    mknod(&bl, libc::S_IFBLK | 0o600, libc::makedev(7, 200)).ctx("mknod block 7:200")?;
    let st = lstat(&bl).ctx("lstat block")?;
    check_mode(ftype(&st), libc::S_IFBLK, "block device type")?;
    check_eq(
        (libc::major(st.st_rdev), libc::minor(st.st_rdev)),
        (7, 200),
        "block device (major, minor)",
    )?;
    check_eq(st.st_size, 0, "device node size")?;
    // The char device is usable unless the mount is nodev.
    let nodev = statvfs(&c.dir)
        .map(|s| s.f_flag & libc::ST_NODEV != 0)
        .unwrap_or(false);
    if !nodev {
        let fd = open(&ch, libc::O_WRONLY, 0).ctx("open /dev/null clone")?;
        check_eq(
            write(&fd, b"discard").ctx("write to null device")?,
            7,
            "bytes written to null device",
        )?;
    }
    expect_errno(
        mknod(&ch, libc::S_IFCHR | 0o600, libc::makedev(1, 3)),
        &[libc::EEXIST],
        "mknod existing name",
    )
}

fn mkdir_rmdir(c: &Ctx) -> CheckResult {
    let d = c.p("d");
    let n0 = stat(&c.dir).ctx("stat parent")?.st_nlink;
    mkdir(&d, 0o755).ctx("mkdir")?;
    check_eq(
        stat(&c.dir).ctx("stat parent")?.st_nlink,
        n0 + 1,
        "parent nlink after mkdir",
    )?;
    expect_errno(mkdir(&d, 0o755), &[libc::EEXIST], "mkdir existing dir")?;
    write_file(&c.p("f"), b"", 0o644).ctx("create f")?;
    expect_errno(
        mkdir(&c.p("f"), 0o755),
        &[libc::EEXIST],
        "mkdir over existing file",
    )?;
    expect_errno(
        mkdir(&c.p("f/sub"), 0o755),
        &[libc::ENOTDIR],
        "mkdir under a file",
    )?;
    expect_errno(
        mkdir(&c.p("missing/sub"), 0o755),
        &[libc::ENOENT],
        "mkdir in missing dir",
    )?;
    write_file(&d.join("x"), b"", 0o644).ctx("create d/x")?;
    expect_errno(
        rmdir(&d),
        &[libc::ENOTEMPTY, libc::EEXIST],
        "rmdir non-empty dir",
    )?;
    mkdir(&d.join("sub"), 0o755).ctx("mkdir d/sub")?;
    unlink(&d.join("x")).ctx("unlink d/x")?;
    expect_errno(
        rmdir(&d),
        &[libc::ENOTEMPTY, libc::EEXIST],
        "rmdir dir containing a subdir",
    )?;
    expect_errno(
        rmdir(&d.join("sub/.")),
        &[libc::EINVAL, libc::EBUSY],
        "rmdir d/sub/.",
    )?;
    rmdir(&d.join("sub")).ctx("rmdir d/sub")?;
    check_eq(
        stat(&d).ctx("stat d")?.st_nlink,
        2,
        "d nlink after rmdir of its subdir",
    )?;
    expect_errno(rmdir(&c.p("f")), &[libc::ENOTDIR], "rmdir a file")?;
    rmdir(&d).ctx("rmdir empty dir")?;
    check_eq(
        stat(&c.dir).ctx("stat parent")?.st_nlink,
        n0,
        "parent nlink after rmdir",
    )?;
    expect_errno(stat(&d), &[libc::ENOENT], "stat removed dir")?;
    expect_errno(rmdir(&d), &[libc::ENOENT], "rmdir missing dir")?;
    // A directory's mode honours the requested bits.
    mkdir(&c.p("m"), 0o700).ctx("mkdir 0700")?;
    check_mode(
        perms(&stat(&c.p("m")).ctx("stat")?),
        0o700,
        "mode of mkdir 0700",
    )
}

fn unlink_check(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, b"abc", 0o644).ctx("create")?;
    unlink(&f).ctx("unlink")?;
    expect_errno(stat(&f), &[libc::ENOENT], "stat after unlink")?;
    expect_errno(unlink(&f), &[libc::ENOENT], "unlink missing file")?;
    mkdir(&c.p("d"), 0o755).ctx("mkdir")?;
    expect_errno(
        unlink(&c.p("d")),
        &[libc::EISDIR, libc::EPERM],
        "unlink a directory",
    )?;
    write_file(&c.p("g"), b"", 0o644).ctx("create g")?;
    expect_errno(
        unlink(&c.p("g/x")),
        &[libc::ENOTDIR],
        "unlink through a file",
    )?;
    // Unlinking a symlink removes the link only.
    symlink("g", &c.p("l")).ctx("symlink")?;
    unlink(&c.p("l")).ctx("unlink symlink")?;
    stat(&c.p("g")).ctx("target survives unlink of symlink")?;
    Ok(())
}

fn symlink_readlink(c: &Ctx) -> CheckResult {
    write_file(&c.p("file"), b"content", 0o644).ctx("create")?;
    mkdir(&c.p("sub"), 0o755).ctx("mkdir")?;
    // Relative target resolved relative to the link's directory.
    symlink("../file", &c.p("sub/rel")).ctx("symlink relative")?;
    check_eq(
        readlink(&c.p("sub/rel")).ctx("readlink")?,
        "../file".to_string(),
        "readlink relative",
    )?;
    check_eq(
        read_file(&c.p("sub/rel")).ctx("read via relative link")?,
        b"content".to_vec(),
        "data via relative link",
    )?;
    let abs = c.p("file").to_string_lossy().into_owned();
    symlink(&abs, &c.p("abs")).ctx("symlink absolute")?;
    check_eq(
        readlink(&c.p("abs")).ctx("readlink")?,
        abs,
        "readlink absolute",
    )?;
    check_eq(
        read_file(&c.p("abs")).ctx("read via absolute link")?,
        b"content".to_vec(),
        "data via absolute link",
    )?;
    // Dangling.
    symlink("does/not/exist", &c.p("dangling")).ctx("symlink dangling")?;
    expect_errno(
        stat(&c.p("dangling")),
        &[libc::ENOENT],
        "stat dangling link",
    )?;
    lstat(&c.p("dangling")).ctx("lstat dangling link")?;
    check_eq(
        readlink(&c.p("dangling")).ctx("readlink")?,
        "does/not/exist".to_string(),
        "readlink dangling",
    )?;
    // Long target (up to PATH_MAX-1 bytes is allowed by Linux; use 1000).
    let long = "x/".repeat(500);
    symlink(&long, &c.p("long")).ctx("symlink with 1000-byte target")?;
    check_eq(
        readlink(&c.p("long")).ctx("readlink long")?,
        long,
        "long target round trip",
    )?;
    // Symlink to directory; trailing slash follows.
    symlink("sub", &c.p("dirlink")).ctx("symlink to dir")?;
    check_mode(
        ftype(&stat(&c.p("dirlink/")).ctx("stat dirlink/")?),
        libc::S_IFDIR,
        "dirlink/ resolves to dir",
    )?;
    // Errors.
    expect_errno(
        symlink("x", &c.p("file")),
        &[libc::EEXIST],
        "symlink over existing name",
    )?;
    expect_errno(
        readlink(&c.p("file")),
        &[libc::EINVAL],
        "readlink of a regular file",
    )?;
    expect_errno(
        readlink(&c.p("missing")),
        &[libc::ENOENT],
        "readlink missing",
    )?;
    expect_errno(
        symlink("", &c.p("empty")),
        &[libc::ENOENT],
        "symlink with empty target",
    )
}

fn symlink_loop(c: &Ctx) -> CheckResult {
    symlink("b", &c.p("a")).ctx("symlink a->b")?;
    symlink("a", &c.p("b")).ctx("symlink b->a")?;
    expect_errno(
        open(&c.p("a"), libc::O_RDONLY, 0),
        &[libc::ELOOP],
        "open a symlink loop",
    )?;
    expect_errno(stat(&c.p("a")), &[libc::ELOOP], "stat a symlink loop")?;
    symlink("self", &c.p("self")).ctx("symlink self->self")?;
    expect_errno(
        open(&c.p("self"), libc::O_RDONLY | CREAT, 0o644),
        &[libc::ELOOP],
        "open self-loop with O_CREAT",
    )?;
    write_file(&c.p("f"), b"", 0o644).ctx("create")?;
    symlink("f", &c.p("lf")).ctx("symlink lf->f")?;
    expect_errno(
        open(&c.p("lf"), libc::O_RDONLY | libc::O_NOFOLLOW, 0),
        &[libc::ELOOP],
        "O_NOFOLLOW on a symlink",
    )?;
    // A chain of 30 links resolves (Linux limit is 40).
    let mut prev = "f".to_string();
    for i in 0..30 {
        let name = format!("chain{i}");
        symlink(&prev, &c.p(&name)).ctx("symlink chain")?;
        prev = name;
    }
    open(&c.p(&prev), libc::O_RDONLY, 0).ctx("open through a chain of 30 symlinks")?;
    Ok(())
}

fn link_check(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, b"shared", 0o644).ctx("create")?;
    let st0 = stat(&f).ctx("stat")?;
    link(&f, &c.p("g")).ctx("link f g")?;
    let (sf, sg) = (stat(&f).ctx("stat f")?, stat(&c.p("g")).ctx("stat g")?);
    check_eq(sf.st_ino, sg.st_ino, "hard links share the inode")?;
    check_eq(
        (sf.st_nlink, sg.st_nlink),
        (2, 2),
        "nlink of both names after link",
    )?;
    ensure(
        ts_ns(sf.st_ctime, sf.st_ctime_nsec) >= ts_ns(st0.st_ctime, st0.st_ctime_nsec),
        "ctime must not go back on link",
    )?;
    mkdir(&c.p("sub"), 0o755).ctx("mkdir")?;
    link(&f, &c.p("sub/h")).ctx("link into subdirectory")?;
    check_eq(stat(&f).ctx("stat")?.st_nlink, 3, "nlink after third link")?;
    // Writes through one name are visible through the other.
    let fd = open(&c.p("sub/h"), libc::O_WRONLY, 0).ctx("open h")?;
    pwrite_all(&fd, b"SH", 0).ctx("write via h")?;
    drop(fd);
    check_eq(
        read_file(&f).ctx("read f")?,
        b"SHared".to_vec(),
        "data via other name",
    )?;
    unlink(&f).ctx("unlink f")?;
    check_eq(
        stat(&c.p("g")).ctx("stat g")?.st_nlink,
        2,
        "nlink after unlinking one name",
    )?;
    check_eq(
        read_file(&c.p("g")).ctx("read g")?,
        b"SHared".to_vec(),
        "data survives unlink of one name",
    )?;
    expect_errno(
        link(&c.p("g"), &c.p("sub/h")),
        &[libc::EEXIST],
        "link onto existing name",
    )?;
    expect_errno(
        link(&c.p("sub"), &c.p("sublink")),
        &[libc::EPERM],
        "hard link to a directory",
    )?;
    expect_errno(
        link(&c.p("missing"), &c.p("x")),
        &[libc::ENOENT],
        "link from missing source",
    )?;
    // Hard link to a symlink links the symlink itself (link(2) does not follow on Linux).
    symlink("g", &c.p("sl")).ctx("symlink")?;
    link(&c.p("sl"), &c.p("sl2")).ctx("link a symlink")?;
    check_mode(
        ftype(&lstat(&c.p("sl2")).ctx("lstat")?),
        libc::S_IFLNK,
        "hard link of a symlink is a symlink",
    )
}

fn rename_file(c: &Ctx) -> CheckResult {
    write_file(&c.p("a"), b"AAA", 0o644).ctx("create a")?;
    let ino = stat(&c.p("a")).ctx("stat")?.st_ino;
    rename(&c.p("a"), &c.p("b")).ctx("rename a b")?;
    expect_errno(stat(&c.p("a")), &[libc::ENOENT], "old name after rename")?;
    let st = stat(&c.p("b")).ctx("stat b")?;
    check_eq(st.st_ino, ino, "inode preserved by rename")?;
    check_eq(
        read_file(&c.p("b")).ctx("read")?,
        b"AAA".to_vec(),
        "content after rename",
    )?;
    // Over an existing file; an open fd on the replaced file keeps working.
    write_file(&c.p("c"), b"CCC", 0o644).ctx("create c")?;
    let victim = open(&c.p("c"), libc::O_RDONLY, 0).ctx("open c")?;
    rename(&c.p("b"), &c.p("c")).ctx("rename b over c")?;
    check_eq(
        read_file(&c.p("c")).ctx("read c")?,
        b"AAA".to_vec(),
        "c replaced",
    )?;
    let mut buf = [0u8; 3];
    check_eq(
        pread_full(&victim, &mut buf, 0).ctx("read replaced file via fd")?,
        3,
        "bytes",
    )?;
    check_eq(&buf, b"CCC", "replaced file still readable through open fd")?;
    check_eq(
        fstat(&victim).ctx("fstat")?.st_nlink,
        0,
        "nlink of replaced file",
    )?;
    // Rename onto itself and between hard links of the same inode are no-ops.
    rename(&c.p("c"), &c.p("c")).ctx("rename onto itself")?;
    link(&c.p("c"), &c.p("c2")).ctx("link")?;
    rename(&c.p("c"), &c.p("c2")).ctx("rename between hard links")?;
    stat(&c.p("c")).ctx("both hard links remain after rename between them")?;
    // Between directories.
    mkdir(&c.p("d"), 0o755).ctx("mkdir")?;
    rename(&c.p("c2"), &c.p("d/moved")).ctx("rename into subdir")?;
    check_eq(
        read_file(&c.p("d/moved")).ctx("read")?,
        b"AAA".to_vec(),
        "moved content",
    )?;
    expect_errno(
        rename(&c.p("missing"), &c.p("x")),
        &[libc::ENOENT],
        "rename missing source",
    )?;
    expect_errno(
        rename(&c.p("c"), &c.p("nodir/x")),
        &[libc::ENOENT],
        "rename into missing dir",
    )?;
    expect_errno(
        rename(&c.p("c"), &c.p("d/moved/x")),
        &[libc::ENOTDIR],
        "rename under a file",
    )
}

fn rename_dir_over_dir(c: &Ctx) -> CheckResult {
    mkdir(&c.p("src"), 0o755).ctx("mkdir src")?;
    write_file(&c.p("src/f"), b"x", 0o644).ctx("create src/f")?;
    mkdir(&c.p("empty"), 0o755).ctx("mkdir empty")?;
    let n0 = stat(&c.dir).ctx("stat")?.st_nlink;
    rename(&c.p("src"), &c.p("empty")).ctx("rename dir over empty dir")?;
    check_eq(
        read_file(&c.p("empty/f")).ctx("read")?,
        b"x".to_vec(),
        "content after dir replace",
    )?;
    check_eq(
        stat(&c.dir).ctx("stat")?.st_nlink,
        n0 - 1,
        "parent nlink after dir replaced another",
    )?;
    mkdir(&c.p("other"), 0o755).ctx("mkdir other")?;
    expect_errno(
        rename(&c.p("other"), &c.p("empty")),
        &[libc::ENOTEMPTY, libc::EEXIST],
        "rename dir onto non-empty dir",
    )?;
    stat(&c.p("other")).ctx("source still exists after failed rename")?;
    Ok(())
}

fn rename_type_mismatch(c: &Ctx) -> CheckResult {
    mkdir(&c.p("d"), 0o755).ctx("mkdir")?;
    write_file(&c.p("f"), b"", 0o644).ctx("create")?;
    expect_errno(
        rename(&c.p("d"), &c.p("f")),
        &[libc::ENOTDIR],
        "rename dir over file",
    )?;
    expect_errno(
        rename(&c.p("f"), &c.p("d")),
        &[libc::EISDIR],
        "rename file over dir",
    )?;
    check_mode(
        ftype(&stat(&c.p("d")).ctx("stat d")?),
        libc::S_IFDIR,
        "d untouched",
    )?;
    check_mode(
        ftype(&stat(&c.p("f")).ctx("stat f")?),
        libc::S_IFREG,
        "f untouched",
    )
}

fn rename_into_own_subtree(c: &Ctx) -> CheckResult {
    mkdir(&c.p("d"), 0o755).ctx("mkdir")?;
    mkdir(&c.p("d/sub"), 0o755).ctx("mkdir")?;
    expect_errno(
        rename(&c.p("d"), &c.p("d/sub/x")),
        &[libc::EINVAL],
        "rename dir into its own subtree",
    )?;
    expect_errno(
        rename(&c.p("d"), &c.p("d/x")),
        &[libc::EINVAL],
        "rename dir into itself",
    )?;
    expect_errno(
        rename(&c.p("d/sub"), &c.p("d/sub/deeper")),
        &[libc::EINVAL],
        "rename subdir into itself",
    )?;
    // Renaming a parent over its own (empty) descendant fails too.
    expect_errno(
        rename(&c.p("d"), &c.p("d/sub")),
        &[libc::EINVAL, libc::ENOTEMPTY],
        "rename dir over its own child",
    )?;
    stat(&c.p("d/sub")).ctx("tree intact")?;
    Ok(())
}

fn rename_noreplace(c: &Ctx) -> CheckResult {
    write_file(&c.p("a"), b"A", 0o644).ctx("create a")?;
    write_file(&c.p("b"), b"B", 0o644).ctx("create b")?;
    let r = renameat2(&c.p("a"), &c.p("b"), libc::RENAME_NOREPLACE);
    if r == Err(Errno(libc::EINVAL)) || r == Err(Errno(libc::ENOSYS)) {
        return skip(format!(
            "renameat2(RENAME_NOREPLACE) not supported: {}",
            r.unwrap_err()
        ));
    }
    expect_errno(r, &[libc::EEXIST], "RENAME_NOREPLACE onto existing file")?;
    check_eq(
        read_file(&c.p("b")).ctx("read b")?,
        b"B".to_vec(),
        "target untouched",
    )?;
    renameat2(&c.p("a"), &c.p("c"), libc::RENAME_NOREPLACE)
        .ctx("RENAME_NOREPLACE onto free name")?;
    check_eq(
        read_file(&c.p("c")).ctx("read c")?,
        b"A".to_vec(),
        "content after RENAME_NOREPLACE",
    )?;
    expect_errno(stat(&c.p("a")), &[libc::ENOENT], "old name gone")
}

/// renameat2(RENAME_WHITEOUT): the rename happens and the source name is left to a whiteout,
/// a character device 0:0 (what overlayfs uses to hide lower files); it does not combine
/// with RENAME_EXCHANGE. (Since Linux 5.8 it no longer needs CAP_MKNOD.)
fn rename_whiteout(c: &Ctx) -> CheckResult {
    const WHITEOUT: libc::c_uint = 4;
    let (a, b) = (c.p("a"), c.p("b"));
    write_file(&a, b"moved", 0o644).ctx("create a")?;
    renameat2(&a, &b, WHITEOUT).ctx("renameat2 RENAME_WHITEOUT")?;
    check_eq(
        read_file(&b).ctx("read b")?,
        b"moved".to_vec(),
        "content under the new name",
    )?;
    let is_whiteout = |p: &Path, what: &str| -> CheckResult {
        let st = lstat(p).ctx(format!("lstat {what}"))?;
        check_eq(ftype(&st), libc::S_IFCHR, format!("type of {what}"))?;
        check_eq(st.st_rdev, 0, format!("device of {what}"))
    };
    is_whiteout(&a, "the whiteout left at the old name")?;
    // Over an existing target, and for a directory.
    write_file(&c.p("x"), b"new", 0o644).ctx("create x")?;
    renameat2(&c.p("x"), &b, WHITEOUT).ctx("RENAME_WHITEOUT over an existing file")?;
    check_eq(
        read_file(&b).ctx("read b")?,
        b"new".to_vec(),
        "the target was replaced",
    )?;
    is_whiteout(&c.p("x"), "the whiteout of the replacing file")?;
    mkdir(&c.p("d"), 0o755).ctx("mkdir d")?;
    write_file(&c.p("d").join("in"), b"", 0o644).ctx("create d/in")?;
    renameat2(&c.p("d"), &c.p("e"), WHITEOUT).ctx("RENAME_WHITEOUT of a directory")?;
    stat(&c.p("e").join("in")).ctx("the directory moved with its entries")?;
    is_whiteout(&c.p("d"), "the whiteout of a directory")?;
    expect_errno(
        renameat2(&b, &c.p("e"), WHITEOUT | libc::RENAME_EXCHANGE),
        &[libc::EINVAL],
        "RENAME_WHITEOUT with RENAME_EXCHANGE",
    )?;
    // A whiteout is an ordinary name again once removed.
    unlink(&c.p("x")).ctx("unlink a whiteout")?;
    write_file(&c.p("x"), b"back", 0o644).ctx("reuse the whiteout's name")
}

fn rename_exchange(c: &Ctx) -> CheckResult {
    write_file(&c.p("f"), b"file", 0o644).ctx("create f")?;
    mkdir(&c.p("d"), 0o755).ctx("mkdir d")?;
    write_file(&c.p("d/inner"), b"", 0o644).ctx("create d/inner")?;
    let (fi, di) = (
        stat(&c.p("f")).ctx("stat")?.st_ino,
        stat(&c.p("d")).ctx("stat")?.st_ino,
    );
    let r = renameat2(&c.p("f"), &c.p("d"), libc::RENAME_EXCHANGE);
    if r == Err(Errno(libc::EINVAL)) || r == Err(Errno(libc::ENOSYS)) {
        return skip(format!(
            "renameat2(RENAME_EXCHANGE) not supported: {}",
            r.unwrap_err()
        ));
    }
    r.ctx("RENAME_EXCHANGE file <-> dir")?;
    let (sf, sd) = (
        lstat(&c.p("f")).ctx("lstat f")?,
        lstat(&c.p("d")).ctx("lstat d")?,
    );
    check_eq((sf.st_ino, sd.st_ino), (di, fi), "inodes swapped")?;
    check_mode(ftype(&sf), libc::S_IFDIR, "f is now the directory")?;
    check_eq(
        read_file(&c.p("d")).ctx("read d")?,
        b"file".to_vec(),
        "d is now the file",
    )?;
    stat(&c.p("f/inner")).ctx("directory content follows the exchange")?;
    // Exchange across directories updates '..'.
    mkdir(&c.p("p"), 0o755).ctx("mkdir p")?;
    mkdir(&c.p("p/q"), 0o755).ctx("mkdir p/q")?;
    renameat2(&c.p("f"), &c.p("p/q"), libc::RENAME_EXCHANGE)
        .ctx("RENAME_EXCHANGE dir <-> dir across parents")?;
    check_eq(
        stat(&c.p("p/q/..")).ctx("stat p/q/..")?.st_ino,
        stat(&c.p("p")).ctx("stat p")?.st_ino,
        "'..' of exchanged dir",
    )?;
    check_eq(
        stat(&c.p("f/..")).ctx("stat f/..")?.st_ino,
        stat(&c.dir).ctx("stat")?.st_ino,
        "'..' of other exchanged dir",
    )?;
    expect_errno(
        renameat2(&c.p("d"), &c.p("missing"), libc::RENAME_EXCHANGE),
        &[libc::ENOENT],
        "RENAME_EXCHANGE with missing target",
    )?;
    expect_errno(
        renameat2(
            &c.p("d"),
            &c.p("x"),
            libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE,
        ),
        &[libc::EINVAL],
        "RENAME_EXCHANGE|RENAME_NOREPLACE",
    )
}

fn rename_dir_between_parents(c: &Ctx) -> CheckResult {
    for d in ["p1", "p2", "p1/child", "p1/child/grand"] {
        mkdir(&c.p(d), 0o755).ctx(format!("mkdir {d}"))?;
    }
    let nl = |p: &str| stat(&c.p(p)).map(|s| s.st_nlink);
    check_eq(
        (nl("p1").ctx("stat")?, nl("p2").ctx("stat")?),
        (3, 2),
        "nlink of p1, p2 before",
    )?;
    rename(&c.p("p1/child"), &c.p("p2/child")).ctx("move dir p1/child -> p2/child")?;
    check_eq(
        (nl("p1").ctx("stat")?, nl("p2").ctx("stat")?),
        (2, 3),
        "nlink of p1, p2 after moving a subdir",
    )?;
    check_eq(
        stat(&c.p("p2/child/..")).ctx("stat ..")?.st_ino,
        stat(&c.p("p2")).ctx("stat p2")?.st_ino,
        "'..' of moved dir points at the new parent",
    )?;
    check_eq(
        nl("p2/child").ctx("stat")?,
        3,
        "nlink of the moved dir itself",
    )?;
    stat(&c.p("p2/child/grand")).ctx("grandchild follows the move")?;
    // Rename within the same directory leaves parent nlink alone.
    rename(&c.p("p2/child"), &c.p("p2/renamed")).ctx("rename within p2")?;
    check_eq(
        nl("p2").ctx("stat")?,
        3,
        "nlink of p2 after rename within it",
    )?;
    // Moving a dir over an empty dir in another parent.
    mkdir(&c.p("p1/empty"), 0o755).ctx("mkdir")?;
    rename(&c.p("p2/renamed"), &c.p("p1/empty")).ctx("move dir over empty dir across parents")?;
    check_eq(
        (nl("p1").ctx("stat")?, nl("p2").ctx("stat")?),
        (3, 2),
        "nlink of p1, p2 after replacing move",
    )?;
    check_eq(
        stat(&c.p("p1/empty/..")).ctx("stat")?.st_ino,
        stat(&c.p("p1")).ctx("stat")?.st_ino,
        "'..' after replacing move",
    )
}
