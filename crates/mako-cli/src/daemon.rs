//! `mako up` and `mako down`, and the helpers every command uses to reach makod:
//! connecting, calling, finding and starting the binary, waiting with a spinner,
//! checking processes and mounts.

use std::fs::{self, OpenOptions};
use std::io::{IsTerminal, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use mako_control::mount_table::{self, Probe};
use mako_control::{
    ClientError, ClusterConfig, ControlClient, DaemonStatus, DataDir, DiskDef, FsDef, Request,
    Response,
};

use crate::cli::{Context, UpArgs};
use crate::units::{human_bytes, parse_size_flag};

/// How long `mako up` waits for makod to answer and mount.
const UP_WAIT: Duration = Duration::from_secs(30);
/// How long `mako down` waits for makod to exit and the mounts to go.
const DOWN_WAIT: Duration = Duration::from_secs(60);
/// How long a mount or unmount request may take.
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(120);
/// Lines of makod.log shown when makod fails to start.
const LOG_TAIL_LINES: usize = 25;
/// How often `mako up` and `mako down` look whether makod is ready / gone: a status
/// query or a look at /proc, cheap; every mount and unmount waits for the next look.
const POLL: Duration = Duration::from_millis(20);

/// Name of the default file system of `mako up`.
const DEFAULT_FS: &str = "fs1";

/// Connects to makod; `Ok(None)` if it is not running.
pub fn try_connect(data: &DataDir) -> Result<Option<ControlClient>> {
    match ControlClient::connect(&data.socket_file()) {
        Ok(client) => Ok(Some(client)),
        Err(ClientError::NotRunning { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Connects to makod; an error that says how to start it if it is not running.
pub fn connect(data: &DataDir) -> Result<ControlClient> {
    Ok(ControlClient::connect(&data.socket_file())?)
}

/// Sends `request`; `Ok(message)` for `Response::Ok`, an error for `Response::Error`
/// or any other answer.
pub fn call_ok(context: &Context, request: &Request) -> Result<String> {
    let mut client = connect(&context.data)?;
    client.set_timeout(MOUNT_TIMEOUT);
    expect_ok(client.call(request)?, request)
}

/// The message of an `Ok` response, or an error.
pub fn expect_ok(response: Response, request: &Request) -> Result<String> {
    match response {
        Response::Ok { message } => Ok(message),
        Response::Error { message } => Err(anyhow!("makod: {message}")),
        other => Err(unexpected(request, &other)),
    }
}

/// The error for an answer of the wrong kind.
pub fn unexpected(request: &Request, response: &Response) -> anyhow::Error {
    anyhow!(
        "makod answered `{}` with `{}`; the CLI and makod may come from different builds",
        request.name(),
        response.name()
    )
}

/// The daemon's status, `None` if it is not running.
pub fn query_status(data: &DataDir) -> Result<Option<DaemonStatus>> {
    let Some(mut client) = try_connect(data)? else {
        return Ok(None);
    };
    match client.call(&Request::Status)? {
        Response::Status(status) => Ok(Some(status)),
        Response::Error { message } => Err(anyhow!("makod: {message}")),
        other => Err(unexpected(&Request::Status, &other)),
    }
}

/// True if a process with this id exists.
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let result = unsafe { libc::kill(pid, 0) };
    let exists = result == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    // A zombie (exited, not yet reaped by its new parent) has stopped for our purposes.
    exists && !is_zombie(pid)
}

/// True if `/proc/PID/stat` shows state `Z` (or `X`).
fn is_zombie(pid: libc::pid_t) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The command name is in parentheses and may contain spaces: the state follows
    // the last `)`.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .is_some_and(|state| state == 'Z' || state == 'X')
}

/// The pid in `makod.pid`, if the file exists and holds one.
pub fn read_pid(data: &DataDir) -> Option<u32> {
    fs::read_to_string(data.pid_file())
        .ok()
        .and_then(|t| t.trim().parse().ok())
}

/// True if anything is mounted at `path` now (the kernel's mount table).
pub fn is_mounted(path: &Path) -> bool {
    mount_table::is_mounted(path)
}

/// A one-line progress indicator on stderr (only when stderr is a terminal).
pub struct Spinner {
    start: Instant,
    tick: usize,
    active: bool,
}

impl Spinner {
    pub fn new() -> Self {
        Spinner {
            start: Instant::now(),
            tick: 0,
            active: std::io::stderr().is_terminal(),
        }
    }

    /// Redraws the line with `what` and the elapsed time.
    pub fn update(&mut self, what: &str) {
        if !self.active {
            return;
        }
        const FRAMES: [char; 4] = ['|', '/', '-', '\\'];
        self.tick += 1;
        eprint!(
            "\r\x1b[2K{} {what} ({:.0} s)",
            FRAMES[self.tick % FRAMES.len()],
            self.start.elapsed().as_secs_f64()
        );
        let _ = std::io::stderr().flush();
    }

    /// Clears the line.
    pub fn finish(&mut self) {
        if self.active {
            eprint!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
            self.active = false;
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The last `lines` lines of a file, for showing why makod failed.
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(text) = fs::read(path) else {
        return format!("(cannot read {})", path.display());
    };
    let text = String::from_utf8_lossy(&text);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `makod` beside the current executable, else on `PATH`.
pub fn find_makod() -> Result<PathBuf> {
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let candidate = dir.join("makod");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("makod");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!(
        "cannot find the `makod` binary next to {} or on PATH; build it with \
         `cargo build -p makod` (it lands next to `mako`) or put it on PATH",
        std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "mako".to_string())
    )
}

/// This machine's host name (the node name of a new cluster).
fn host_name() -> String {
    let name = fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(mako_control::cluster::NAME_BYTES_MAX)
        .collect();
    let name = name.trim_start_matches(['-', '.']).to_string();
    if name.is_empty() {
        "node1".to_string()
    } else {
        name
    }
}

/// `mako up`.
pub fn up(context: &Context, args: &UpArgs) -> Result<ExitCode> {
    let data = &context.data;
    if crate::nodes_cmd::is_multi(data, args)? {
        return crate::nodes_cmd::up(context, args);
    }
    let created = if ClusterConfig::exists(&data.root) {
        let cluster = context.cluster()?;
        let ignored: Vec<&str> = [
            ("--disks", args.disks.is_some()),
            ("--disk-size", args.disk_size.is_some()),
            ("--block-size", args.block_size.is_some()),
            ("--mountpoint", args.mountpoint.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect();
        if !ignored.is_empty() {
            eprintln!(
                "note: {} only apply when the cluster is created; the cluster in {} exists already \
                 (change a file system with `mako fs create`, or start afresh in another --data-dir)",
                ignored.join(", "),
                data.root.display()
            );
        }
        let status = query_status(data)?;
        if let Some(status) = &status {
            if all_automounts_mounted(&cluster, status) {
                println!("Mako is already up; nothing changed.\n");
                if let Some(pagepool) = &args.pagepool {
                    println!(
                        "--pagepool ignored: makod is running. To change it: \
                         `mako config set pagepool={pagepool}`, then `mako down && mako up`.\n"
                    );
                }
                print!("{}", crate::status::render_status(&cluster, status, data));
                return Ok(ExitCode::SUCCESS);
            }
        }
        if let Some(pagepool) = &args.pagepool {
            if status.is_some() {
                eprintln!(
                    "note: --pagepool is saved but makod is already running; it takes effect \
                     after `mako down && mako up`"
                );
            }
            store_pagepool(data, pagepool)?;
        }
        cluster
    } else {
        create_cluster(data, args, 1)?
    };
    start_and_wait(data, &created)?;
    let status = query_status(data)?.ok_or_else(|| {
        anyhow!(
            "makod stopped right after starting; see {}",
            data.log_file().display()
        )
    })?;
    print_up_summary(data, &created, &status);
    Ok(ExitCode::SUCCESS)
}

fn store_pagepool(data: &DataDir, pagepool: &str) -> Result<()> {
    let mut store = mako_config::ConfigStore::load_or_default(data.config_file())?;
    store
        .set("pagepool", pagepool)
        .map_err(|e| anyhow!("--pagepool {pagepool}: {e}"))?;
    store.save()?;
    Ok(())
}

fn all_automounts_mounted(cluster: &ClusterConfig, status: &DaemonStatus) -> bool {
    cluster
        .filesystems
        .iter()
        .filter(|f| f.automount)
        .all(|f| mounted_now(f, status))
}

/// True if makod reports `fs` mounted. makod checks its mounts against the kernel's
/// mount table before it answers (`makod::mount_state`), so this is the real state.
fn mounted_now(fs: &FsDef, status: &DaemonStatus) -> bool {
    status
        .filesystems
        .iter()
        .any(|s| s.name == fs.name && s.mounted)
}

/// How long a look at a possibly dead mount may take before it counts as hung.
const PROBE_LIMIT: Duration = Duration::from_secs(5);

/// Cleans up after a makod that is gone (`kill -9`, a crash of the node): its FUSE
/// mounts stay in the kernel's mount table, dead (every access fails with ENOTCONN or
/// ECONNABORTED),
/// and its control socket and pid file stay in the data directory. Only what is
/// certainly its own is touched: a mount at a mount point of this cluster whose source
/// is `mako:NAME` of the file system configured there and whose connection is gone, and
/// the socket and pid file of a pid that no longer runs makod (a zombie counts as
/// gone). A mount of its own that does not answer at all (a killed makod stuck
/// exiting in the kernel on it) has its FUSE connection aborted first (fusectl), which
/// makes it dead. Anything else mounted at a mount point is an error that says what to do.
/// Returns what was done, one line each; nothing if there was nothing to do.
pub fn clean_up_after_dead_daemon(data: &DataDir, cluster: &ClusterConfig) -> Result<Vec<String>> {
    let mut done = Vec::new();
    for fs in &cluster.filesystems {
        let mp = &fs.mountpoint;
        // A failed earlier attempt may have left mounts stacked: clean them one by one.
        for _ in 0..8 {
            let Some(entry) = mount_table::at(mp) else {
                break;
            };
            if entry.mako_fs() != Some(fs.name.as_str()) {
                if !fs.automount {
                    break;
                }
                bail!(
                    "{} is the mount point of {}, but another file system is mounted there \
                     ({} {}). Unmount it (`umount {}`), then run `mako up` again",
                    mp.display(),
                    fs.name,
                    entry.fstype,
                    entry.source,
                    mp.display()
                );
            }
            let mut probe = mount_table::probe(mp, PROBE_LIMIT);
            if let Probe::Unknown(why) = &probe {
                // No makod runs for this data directory, yet the connection did not
                // answer: a makod killed while one of its threads was in the kernel on
                // this connection (an entry invalidation waiting for a directory lock
                // that a request to the dead makod holds) cannot finish exiting, and
                // keeps the connection open, so every access hangs. Aborting the
                // connection ends those requests and lets it exit.
                mount_table::abort_fuse_connection(entry.device).with_context(|| {
                    format!(
                        "{} ({}) does not answer ({why}) and no makod runs for {}; aborting                          its FUSE connection failed. Abort it with `echo 1 >                          /sys/fs/fuse/connections/{}/abort`, then run `mako up` again",
                        mp.display(),
                        entry.source,
                        data.root.display(),
                        entry.device.1
                    )
                })?;
                done.push(format!(
                    "aborted the FUSE connection {} of {} on {}: it did not answer ({why}) and                      no makod runs",
                    entry.device.1,
                    fs.name,
                    mp.display()
                ));
                probe = mount_table::probe(mp, PROBE_LIMIT);
            }
            match probe {
                Probe::Dead => {}
                Probe::Answers => bail!(
                    "{} is mounted ({}) and answers, but no makod runs for {}: a makod with \
                     another --data-dir may serve it. Stop that one, or unmount it with \
                     `umount -l {}`, then run `mako up` again",
                    mp.display(),
                    entry.source,
                    data.root.display(),
                    mp.display()
                ),
                Probe::Unknown(why) => bail!(
                    "{} is still mounted ({}) but no makod runs, and looking at it failed \
                     ({why}). Remove it with `umount -l {}` (or `fusermount -uz {}`), then run \
                     `mako up` again",
                    mp.display(),
                    entry.source,
                    mp.display(),
                    mp.display()
                ),
            }
            mount_table::lazy_unmount(mp).with_context(|| {
                format!(
                    "cannot remove the dead mount of {} on {}; remove it with `umount -l {}` \
                     (or `fusermount -uz {}`), then run `mako up` again",
                    fs.name,
                    mp.display(),
                    mp.display(),
                    mp.display()
                )
            })?;
            done.push(format!(
                "lazily unmounted the dead FUSE mount of {} on {} (its connection is gone)",
                fs.name,
                mp.display()
            ));
        }
    }
    let socket = data.socket_file();
    if socket.exists() {
        fs::remove_file(&socket)
            .with_context(|| format!("cannot remove the stale socket {}", socket.display()))?;
        done.push(format!(
            "removed the stale control socket {}",
            socket.display()
        ));
    }
    if let Some(pid) = read_pid(data) {
        fs::remove_file(data.pid_file()).with_context(|| {
            format!(
                "cannot remove the stale pid file {}",
                data.pid_file().display()
            )
        })?;
        done.push(format!(
            "removed the stale pid file {} (makod pid {pid} is gone)",
            data.pid_file().display()
        ));
    }
    Ok(done)
}

/// Prints what `clean_up_after_dead_daemon` did.
fn print_clean_up(done: &[String]) {
    if done.is_empty() {
        return;
    }
    println!("Cleaned up after makod, which is gone (killed, or the node crashed):");
    for line in done {
        println!("  - {line}");
    }
}

/// Creates data dir, disk files, file system `fs1`, cluster.toml and config.toml.
/// On failure removes the disk files it created, so a retry starts clean.
pub(crate) fn create_cluster(data: &DataDir, args: &UpArgs, nodes: u32) -> Result<ClusterConfig> {
    let disk_count = args.disks.unwrap_or(4);
    if !(1..=64).contains(&disk_count) {
        bail!("--disks {disk_count}: must be from 1 to 64");
    }
    let disk_bytes = parse_size_flag("--disk-size", args.disk_size.as_deref().unwrap_or("8G"))?;
    let block_text = args.block_size.as_deref().unwrap_or("4M");
    let block_bytes = crate::fs_cmd::parse_block_size("--block-size", block_text)?;
    // A disk must hold its header and descriptor area and a useful number of blocks.
    let disk_bytes_min = 64 * u64::from(block_bytes);
    if disk_bytes < disk_bytes_min {
        bail!(
            "--disk-size {}: too small for {} blocks; each disk needs at least 64 blocks ({})",
            args.disk_size.as_deref().unwrap_or("8G"),
            block_text,
            human_bytes(disk_bytes_min)
        );
    }
    if let Some(pagepool) = &args.pagepool {
        // Validate before anything is created.
        mako_config::value::parse("pagepool", pagepool)
            .map_err(|e| anyhow!("--pagepool {pagepool}: {e}"))?;
    }
    let mountpoint = args
        .mountpoint
        .clone()
        .unwrap_or_else(mako_control::default_mountpoint);
    let mountpoint = absolute(&mountpoint)?;
    let disks_dir = data.disks_dir();
    fs::create_dir_all(&disks_dir)
        .with_context(|| format!("cannot create the data directory {}", disks_dir.display()))?;

    let mut cluster = ClusterConfig::new("mako", &host_name(), 0);
    for i in 0..disk_count {
        let path = disks_dir.join(format!("d{i}.img"));
        if path.exists() {
            bail!(
                "{} exists but {} does not: it may hold an old file system. Move the files in {} \
                 away (or delete them if they are not needed), then run `mako up` again",
                path.display(),
                data.cluster_file().display(),
                disks_dir.display()
            );
        }
        cluster.disks.push(DiskDef {
            name: format!("d{i}"),
            path,
            size_bytes: disk_bytes,
            pool: "system".into(),
            failure_group: i32::try_from(i + 1).unwrap_or(i32::MAX),
            usage: "dataAndMetadata".into(),
            fs: Some(DEFAULT_FS.into()),
            servers: Vec::new(),
        });
    }
    cluster.filesystems.push(FsDef {
        name: DEFAULT_FS.into(),
        disks: cluster.disks.iter().map(|d| d.name.clone()).collect(),
        mountpoint: mountpoint.clone(),
        automount: true,
        mount_options: String::new(),
    });
    cluster.validate()?;

    let mut created_files: Vec<PathBuf> = Vec::new();
    let result = (|| -> Result<()> {
        for disk in &cluster.disks {
            crate::fs_cmd::create_sparse_file(&disk.path, disk.size_bytes)?;
            created_files.push(disk.path.clone());
        }
        let params = mako_fs::mkfs::MkfsParams {
            name: DEFAULT_FS.into(),
            block_bytes,
            log_count: nodes.max(args.max_nodes.unwrap_or(0)),
            ..Default::default()
        };
        let specs = crate::fs_cmd::disk_specs(&cluster.disks)?;
        eprintln!(
            "Formatting {DEFAULT_FS} on {disk_count} disks of {} ({} blocks) …",
            human_bytes(disk_bytes),
            block_text
        );
        mako_fs::mkfs::format(&specs, &params)
            .map_err(|e| anyhow!("cannot create file system {DEFAULT_FS}: {e}"))?;
        let mut store = mako_config::ConfigStore::load_or_default(data.config_file())?;
        if let Some(pagepool) = &args.pagepool {
            store
                .set("pagepool", pagepool)
                .map_err(|e| anyhow!("--pagepool {pagepool}: {e}"))?;
        }
        store.save()?;
        cluster.save(&data.root)?;
        Ok(())
    })();
    if let Err(error) = result {
        for path in created_files {
            let _ = fs::remove_file(path);
        }
        return Err(error);
    }
    Ok(cluster)
}

/// `path` made absolute against the current directory.
pub fn absolute(path: &Path) -> Result<PathBuf> {
    if path.is_absolute() {
        Ok(path.to_path_buf())
    } else {
        Ok(std::env::current_dir()
            .context("cannot read the current directory")?
            .join(path))
    }
}

/// Starts makod unless it runs, and waits until it answers and has mounted every
/// automount file system.
///
/// 1. Create missing mount point directories.
/// 2. If a live makod (pid file) exists, do not start another; else spawn one,
///    detached in its own session, stdout and stderr appended to makod.log.
/// 3. Poll: has the child exited (show the log)? Does the socket answer Status? Are
///    the automount file systems mounted? Mount requests are sent once for any that
///    a running daemon has not mounted.
pub(crate) fn start_and_wait(data: &DataDir, cluster: &ClusterConfig) -> Result<()> {
    // 1.
    let daemon_answers = query_status(data).ok().flatten().is_some();
    let live_pid = read_pid(data).filter(|&pid| process_alive(pid) && pid_is_makod(pid));
    if !daemon_answers && live_pid.is_none() {
        print_clean_up(&clean_up_after_dead_daemon(data, cluster)?);
    }
    for fs in cluster.filesystems.iter().filter(|f| f.automount) {
        fs::create_dir_all(&fs.mountpoint).with_context(|| {
            format!(
                "cannot create mount point {} of {}",
                fs.mountpoint.display(),
                fs.name
            )
        })?;
    }
    // 2.
    let running = query_status(data).ok().flatten();
    let existing_pid = running
        .as_ref()
        .map(|s| s.pid)
        .or_else(|| read_pid(data).filter(|&pid| process_alive(pid) && pid_is_makod(pid)));
    if let Some(status) = &running {
        for fs in cluster.filesystems.iter().filter(|f| f.automount) {
            if !mounted_now(fs, status) {
                println!(
                    "{} is not mounted although makod (pid {}) runs (unmounted from outside?); \
                     mounting it again.",
                    fs.name, status.pid
                );
            }
        }
    }
    let mut child = None;
    let pid = match existing_pid {
        Some(pid) => pid,
        None => {
            let makod = find_makod()?;
            let log_path = data.log_file();
            let log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .with_context(|| format!("cannot open {}", log_path.display()))?;
            let log_err = log.try_clone()?;
            let mut command = Command::new(&makod);
            command
                .arg("--data-dir")
                .arg(&data.root)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err);
            // SAFETY: setsid is async-signal-safe; it detaches makod from our terminal
            // and process group so it survives this command and the login session.
            unsafe {
                command.pre_exec(|| {
                    if libc::setsid() == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let spawned = command
                .spawn()
                .with_context(|| format!("cannot start {}", makod.display()))?;
            let pid = spawned.id();
            fs::write(data.pid_file(), format!("{pid}\n"))
                .with_context(|| format!("cannot write {}", data.pid_file().display()))?;
            child = Some(spawned);
            pid
        }
    };
    // 3.
    let mut spinner = Spinner::new();
    let mut mount_requested = false;
    loop {
        if let Some(child) = child.as_mut() {
            if let Some(exit) = child.try_wait()? {
                spinner.finish();
                let _ = fs::remove_file(data.pid_file());
                bail!(
                    "makod (pid {pid}) exited during start-up ({exit}). Last lines of {}:\n{}\n\n\
                     Fix the problem above, then run `mako up` again.",
                    data.log_file().display(),
                    tail(&data.log_file(), LOG_TAIL_LINES)
                );
            }
        } else if !process_alive(pid) {
            spinner.finish();
            bail!(
                "makod (pid {pid}) is gone. Last lines of {}:\n{}",
                data.log_file().display(),
                tail(&data.log_file(), LOG_TAIL_LINES)
            );
        }
        let waiting_for = match query_status(data) {
            Ok(Some(status)) => {
                let missing: Vec<&FsDef> = cluster
                    .filesystems
                    .iter()
                    .filter(|f| f.automount)
                    .filter(|f| !mounted_now(f, &status))
                    .collect();
                if missing.is_empty() {
                    spinner.finish();
                    return Ok(());
                }
                if child.is_none() && !mount_requested {
                    // A daemon that was already running: ask it to mount what is missing.
                    mount_requested = true;
                    for fs in &missing {
                        let request = Request::Mount {
                            fs: fs.name.clone(),
                            mountpoint: None,
                            options: fs.mount_options.clone(),
                        };
                        let mut client = connect(data)?;
                        client.set_timeout(MOUNT_TIMEOUT);
                        spinner.finish();
                        expect_ok(client.call(&request)?, &request).with_context(|| {
                            format!("makod (pid {pid}) runs but cannot mount {}", fs.name)
                        })?;
                    }
                    spinner = Spinner::new();
                }
                let names: Vec<&str> = missing.iter().map(|f| f.name.as_str()).collect();
                format!(
                    "waiting for makod (pid {pid}) to mount {}",
                    names.join(", ")
                )
            }
            Ok(None) => format!("waiting for makod (pid {pid}) to start"),
            Err(e) => format!("waiting for makod (pid {pid}): {e}"),
        };
        if spinner.elapsed() > UP_WAIT {
            spinner.finish();
            bail!(
                "makod (pid {pid}) did not get ready within {} s ({waiting_for}). Last lines of {}:\n{}\n\n\
                 It may still be starting: check `mako status` in a moment, or stop it with `mako down`.",
                UP_WAIT.as_secs(),
                data.log_file().display(),
                tail(&data.log_file(), LOG_TAIL_LINES)
            );
        }
        spinner.update(&waiting_for);
        std::thread::sleep(POLL);
    }
}

/// True if process `pid` runs a program called makod (guards against a reused pid).
fn pid_is_makod(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim() == "makod")
        .unwrap_or(true)
}

fn print_up_summary(data: &DataDir, cluster: &ClusterConfig, status: &DaemonStatus) {
    println!("Mako is up.\n");
    println!("  cluster      {}", cluster.cluster_name);
    println!(
        "  node         {} (id {}), makod pid {}",
        status.node_name, status.node_id, status.pid
    );
    println!("  data dir     {}", data.root.display());
    for fs in &cluster.filesystems {
        let state = status
            .filesystems
            .iter()
            .find(|s| s.name == fs.name)
            .map(|s| {
                if s.mounted {
                    format!(
                        "mounted, {} free of {}",
                        human_bytes(s.free_bytes),
                        human_bytes(s.total_bytes)
                    )
                } else {
                    "not mounted".to_string()
                }
            })
            .unwrap_or_else(|| "unknown to makod".to_string());
        println!(
            "  file system  {} on {} ({state})",
            fs.name,
            fs.mountpoint.display()
        );
        for disk in cluster.disks_of(fs) {
            println!(
                "    disk {:<8} {} ({})",
                disk.name,
                disk.path.display(),
                human_bytes(disk.size_bytes)
            );
        }
    }
    println!("  log          {}", data.log_file().display());
    println!("  config       {}", data.config_file().display());
    println!();
    if let Some(fs) = cluster.filesystems.iter().find(|f| f.automount) {
        println!("Use it:       ls {}", fs.mountpoint.display());
    }
    println!("Next:         `mako status` to see it, `mako down` to stop it");
}

/// `mako down`.
pub fn down(context: &Context) -> Result<ExitCode> {
    if let Ok(cluster) = ClusterConfig::load(&context.data.root) {
        if !cluster.nodes.is_empty() {
            return crate::nodes_cmd::down(context, &cluster);
        }
    }
    down_data(&context.data)
}

/// `mako down` of the makod whose data directory is `data`.
pub(crate) fn down_data(data: &DataDir) -> Result<ExitCode> {
    let cluster = ClusterConfig::load(&data.root).ok();
    let mountpoints: Vec<PathBuf> = cluster
        .as_ref()
        .map(|c| c.filesystems.iter().map(|f| f.mountpoint.clone()).collect())
        .unwrap_or_default();
    let status = query_status(data)?;
    let Some(status) = status else {
        let stale_pid = read_pid(data).filter(|&pid| process_alive(pid) && pid_is_makod(pid));
        if let Some(pid) = stale_pid {
            bail!(
                "makod (pid {pid}) runs but does not answer on {}; stop it with `kill {pid}` \
                 (then `kill -9 {pid}` if it stays), then unmount any leftovers with `umount -l MOUNTPOINT`",
                data.socket_file().display()
            );
        }
        println!(
            "makod is not running (data dir {}); nothing to stop.",
            data.root.display()
        );
        if let Some(cluster) = &cluster {
            match clean_up_after_dead_daemon(data, cluster) {
                Ok(done) => print_clean_up(&done),
                Err(e) => println!("warning: {e:#}"),
            }
        } else {
            let _ = fs::remove_file(data.pid_file());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let pid = status.pid;
    let mut client = connect(data)?;
    client.set_timeout(DOWN_WAIT);
    match client.call(&Request::Shutdown) {
        Ok(Response::Ok { message }) => {
            if !message.is_empty() {
                println!("{message}");
            }
        }
        Ok(Response::Error { message }) => bail!("makod refused to shut down: {message}"),
        Ok(other) => return Err(unexpected(&Request::Shutdown, &other)),
        // The daemon may exit before its answer arrives.
        Err(ClientError::Closed { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let mut spinner = Spinner::new();
    loop {
        let alive = process_alive(pid) && pid_is_makod(pid);
        let mounted: Vec<&PathBuf> = mountpoints.iter().filter(|m| is_mounted(m)).collect();
        if !alive && mounted.is_empty() {
            spinner.finish();
            let _ = fs::remove_file(data.pid_file());
            println!(
                "makod (pid {pid}) stopped after {:.1} s; file systems unmounted.",
                spinner.elapsed().as_secs_f64()
            );
            println!("Start it again with `mako up`.");
            return Ok(ExitCode::SUCCESS);
        }
        if spinner.elapsed() > DOWN_WAIT {
            spinner.finish();
            let mut advice = String::new();
            if alive {
                advice.push_str(&format!(
                    "\n  makod (pid {pid}) still runs: `kill {pid}`, and if it stays, `kill -9 {pid}`"
                ));
            }
            for m in mounted {
                advice.push_str(&format!(
                    "\n  {} is still mounted: `umount -l {}` (or `fusermount -u {}` as a user)",
                    m.display(),
                    m.display(),
                    m.display()
                ));
            }
            bail!(
                "makod did not stop within {} s. Its log: {}{advice}",
                DOWN_WAIT.as_secs(),
                data.log_file().display()
            );
        }
        spinner.update(&format!("waiting for makod (pid {pid}) to stop"));
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_daemon_is_not_an_error_for_queries() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path());
        assert!(query_status(&data).unwrap().is_none());
        let message = connect(&data).unwrap_err().to_string();
        assert!(message.contains("start it with `mako up`"), "{message}");
    }
}
