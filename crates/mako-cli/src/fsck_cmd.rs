//! `mako fsck FS [-n|-y] [--threads N] [--json] [--online]`: check a file system and,
//! with `-y`, repair it (mako-fsck). Online (`--online`): makod checks the mounted
//! file system's committed state and sends the report. Offline: it finds the disks through cluster.toml
//! like `mako fs show`, and refuses while a running makod has the file system
//! mounted. Progress goes to stderr: a bar with ETA on a terminal, JSON lines
//! otherwise; the report goes to stdout (`--json`: as JSON). Exit codes as e2fsck.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mako_control::DiskDef;
use mako_fsck::{JsonLines, Options, Phase, Progress, EXIT_OPERATIONAL};

use crate::cli::{Context, FsckArgs};
use crate::daemon::{process_alive, query_status, read_pid};
use crate::fs_cmd::{disk_specs, no_such_fs};

/// `mako fsck`.
pub fn run(context: &Context, args: &FsckArgs) -> ExitCode {
    match check(context, args) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("mako fsck: error: {error:#}");
            exit(EXIT_OPERATIONAL)
        }
    }
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}

fn check(context: &Context, args: &FsckArgs) -> Result<ExitCode> {
    let cluster = context.cluster()?;
    let fs = cluster
        .filesystem(&args.name)
        .ok_or_else(|| no_such_fs(&cluster, &args.name))?;
    if args.online {
        return online(context, &fs.name, args);
    }
    refuse_if_mounted(context, &fs.name)?;
    let disks: Vec<DiskDef> = cluster.disks_of(fs).into_iter().cloned().collect();
    let specs = disk_specs(&disks)?;
    let opened = mako_fs::mount::open_disk_files(&specs)
        .map_err(|e| anyhow!("opening the disks of {}: {e}", fs.name))?;
    let mut opts = if args.yes {
        Options::repair()
    } else {
        Options::check()
    };
    if let Some(n) = args.threads {
        opts = opts.threads(n);
    }
    opts.cancel = cancel_on_signals();
    let progress: Box<dyn Progress> = if std::io::stderr().is_terminal() {
        Box::new(Bar::new())
    } else {
        Box::new(JsonLines::new(std::io::stderr()))
    };
    match mako_fsck::check_offline(opened, &opts, progress.as_ref()) {
        Ok(report) => {
            progress.finish();
            if args.json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.render());
            }
            Ok(exit(report.exit_code))
        }
        Err(error) => {
            progress.finish();
            eprintln!("mako fsck {}: {error}", fs.name);
            Ok(exit(error.exit_code()))
        }
    }
}

/// `--online`: makod checks the mounted file system's committed state (commits are
/// held off meanwhile: operations go on, an fsync waits) and sends the report.
fn online(context: &Context, name: &str, args: &FsckArgs) -> Result<ExitCode> {
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let mut client = crate::daemon::try_connect(&context.data)?.ok_or_else(|| {
        anyhow!("makod is not running; `mako fsck {name} --online` needs {name} mounted by a running makod — without one, run `mako fsck {name}`")
    })?;
    // A check of a big file system takes a while (about 10 s per million files).
    client.set_timeout(std::time::Duration::from_secs(3600));
    eprintln!(
        "mako fsck {name}: online check of the committed state (commits are held until it ends)"
    );
    match client.call(&mako_control::Request::Fsck {
        fs: name.to_string(),
        threads,
    })? {
        mako_control::Response::Fsck(view) => {
            if args.json {
                println!("{}", view.json);
            } else {
                print!("{}", view.text);
            }
            Ok(exit(view.exit_code))
        }
        mako_control::Response::Error { message } => {
            eprintln!("mako fsck {name}: {message}");
            Ok(exit(EXIT_OPERATIONAL))
        }
        other => bail!("makod answered {} to an fsck request", other.name()),
    }
}

/// An offline check of a mounted file system would read blocks the daemon is
/// changing, and a repair would write under it: refuse, naming the daemon.
fn refuse_if_mounted(context: &Context, name: &str) -> Result<()> {
    let status = match query_status(&context.data) {
        Ok(s) => s,
        Err(error) => match read_pid(&context.data).filter(|&pid| process_alive(pid)) {
            Some(pid) => bail!(
                "makod (pid {pid}) is running but does not answer ({error:#}), so fsck cannot tell whether {name} is \
                 mounted; stop it with `mako down` and run fsck again"
            ),
            None => return Ok(()),
        },
    };
    let Some(status) = status else { return Ok(()) };
    if let Some(fs) = status
        .filesystems
        .iter()
        .find(|f| f.name == name && f.mounted)
    {
        bail!(
            "file system {name} is mounted on {} by makod (pid {}); an offline check needs it unmounted: run \
             `mako fs unmount {name}` (or `mako down`) and try again, or check it mounted with `mako fsck {name} --online`",
            fs.mountpoint,
            status.pid
        );
    }
    Ok(())
}

/// A flag set by SIGINT or SIGTERM: the checker stops at its next safe point instead
/// of dying mid-repair. signal-hook's handlers (with SA_RESTART) wake a thread of its
/// own, which sets the flag and says so. If the handlers cannot be installed the
/// signals keep their default action.
fn cancel_on_signals() -> Arc<AtomicBool> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let flag = Arc::new(AtomicBool::new(false));
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        return flag;
    };
    let taken = flag.clone();
    let spawned = std::thread::Builder::new()
        .name("fsck-signals".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                taken.store(true, Ordering::SeqCst);
                eprintln!("\nmako fsck: interrupted; stopping at the next safe point (a repair finishes its current step)");
            }
        });
    if spawned.is_err() {
        // No thread to report it: the handlers set the flag themselves, silently.
        for signal in [SIGINT, SIGTERM] {
            let _ = signal_hook::flag::register(signal, flag.clone());
        }
    }
    flag
}

/// A progress bar with rate and ETA, one phase at a time.
struct Bar {
    bar: ProgressBar,
    phase: Mutex<Option<Phase>>,
}

impl Bar {
    fn new() -> Bar {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:>28} [{bar:32}] {pos}/{len} {per_sec:>12} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        Bar {
            bar,
            phase: Mutex::new(None),
        }
    }
}

impl Progress for Bar {
    fn update(&self, phase: Phase, done: u64, total: u64) {
        let mut current = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        if *current != Some(phase) {
            *current = Some(phase);
            self.bar.reset();
            self.bar.set_message(phase.label());
        }
        self.bar.set_length(total);
        self.bar.set_position(done);
    }
    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A SIGTERM to the process (here raised by the test's own thread) sets the flag,
    /// whichever thread the kernel delivers it to.
    #[test]
    fn a_signal_sets_the_cancel_flag() {
        let flag = cancel_on_signals();
        assert!(!flag.load(Ordering::SeqCst));
        // SAFETY: raise(3) of a signal whose handler was just installed.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !flag.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "SIGTERM did not set the flag");
            std::thread::sleep(Duration::from_millis(1)); // poll
        }
    }
}
