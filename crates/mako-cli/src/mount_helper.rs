//! `mount.fuse.mako`, the mount helper mount(8) runs for `mount -t fuse.mako` and for
//! `/etc/fstab` lines of type `fuse.mako` (as `mount.gpfs` serves `mount -t gpfs`).
//!
//! It is this program under another name (`mako install-helper` links it into
//! `/sbin`); `main` recognises the name. mount(8) runs it as
//! `mount.fuse.mako SPEC DIR [-sfnv] [-N NS] [-o OPTIONS] [-t TYPE]`, SPEC being
//! `mako:fs1` or `fs1`. The helper asks the running makod (the control socket of
//! `$MAKO_DATA_DIR`, else the default data directory, as every `mako` command does)
//! to mount that file system at DIR with those options, or to remount it
//! (`mount -o remount,ro DIR` runs the helper too: util-linux hands a remount of a
//! `fuse.mako` mount to it). It mounts nothing itself: the FUSE session lives in makod.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context as _, Result};
use mako_control::{DataDir, Request};

use crate::cli::Context;
use crate::daemon;

/// The helper's name, as mount(8) looks for it (`/sbin/mount.<type>`).
pub const HELPER_NAME: &str = "mount.fuse.mako";

/// True if this program was started as the mount helper.
pub fn invoked_as_helper(argv0: &std::ffi::OsStr) -> bool {
    Path::new(argv0)
        .file_name()
        .is_some_and(|n| n == HELPER_NAME || n == "mount.mako")
}

/// What mount(8) passed.
#[derive(Debug, PartialEq, Eq)]
struct HelperArgs {
    fs: String,
    dir: PathBuf,
    options: String,
    fake: bool,
    verbose: bool,
}

fn parse(args: &[String]) -> Result<HelperArgs> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let (mut fake, mut verbose) = (false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => options.push(
                it.next()
                    .ok_or_else(|| anyhow!("-o needs a list of options"))?
                    .clone(),
            ),
            // The type (`fuse.mako`) and the mount namespace are mount(8)'s business.
            "-t" | "-N" => {
                it.next();
            }
            s if s.starts_with("-o") => options.push(s[2..].to_string()),
            s if s.starts_with('-') && s.len() > 1 => {
                for c in s[1..].chars() {
                    match c {
                        // sloppy, no mtab, read-write: nothing to do.
                        's' | 'n' | 'w' => {}
                        'f' => fake = true,
                        'v' => verbose = true,
                        'r' => options.push("ro".into()),
                        _ => bail!("unknown flag -{c} in {s}"),
                    }
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [spec, dir] = positional.as_slice() else {
        bail!(
            "expected a file system and a mount point (`{HELPER_NAME} mako:fs1 /dir -o OPTIONS`), \
             got {positional:?}"
        );
    };
    let fs = spec.strip_prefix("mako:").unwrap_or(spec).to_string();
    if fs.is_empty() {
        bail!("no file system name in `{spec}` (write mako:fs1 or fs1)");
    }
    Ok(HelperArgs {
        fs,
        dir: PathBuf::from(dir),
        options: options.join(","),
        fake,
        verbose,
    })
}

/// Runs the helper; mount(8) reports a failure with the helper's own message.
pub fn run(args: &[String]) -> ExitCode {
    match helper(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{HELPER_NAME}: {e:#}");
            // mount(8)'s "mount failure".
            ExitCode::from(32)
        }
    }
}

fn helper(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    // Checked before makod is asked, so a typo never mounts anything.
    let request =
        mako_control::mount_options::MountRequestOptions::parse(&a.options, &Default::default())
            .map_err(|e| anyhow!("{} on {}: {e}", a.fs, a.dir.display()))?;
    let root = std::env::var_os("MAKO_DATA_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(mako_control::default_data_dir);
    let context = Context {
        data: DataDir::new(root.clone()),
    };
    if daemon::try_connect(&context.data)?.is_none() {
        bail!(
            "cannot mount {} on {}: makod is not running (no control socket at {}). Start it \
             with `mako up` (data directory {}; set MAKO_DATA_DIR for another), then mount again",
            a.fs,
            a.dir.display(),
            context.data.socket_file().display(),
            root.display()
        );
    }
    let dir = mako_control::mount_table::canonical_mountpoint(&a.dir);
    if !request.remount && !dir.is_dir() {
        bail!(
            "cannot mount {} on {}: the mount point is not a directory; create it first",
            a.fs,
            dir.display()
        );
    }
    if a.fake {
        return Ok(());
    }
    let message = daemon::call_ok(
        &context,
        &Request::Mount {
            fs: a.fs.clone(),
            mountpoint: Some(dir.display().to_string()),
            options: a.options.clone(),
        },
    )
    .with_context(|| format!("mounting {} on {}", a.fs, dir.display()))?;
    if a.verbose {
        println!("{message}");
    }
    Ok(())
}

/// `mako install-helper [--dir DIR] [--remove]`: links `DIR/mount.fuse.mako` to this
/// program (replacing an older link), or removes it.
pub fn install(dir: &Path, remove: bool) -> Result<ExitCode> {
    let link = dir.join(HELPER_NAME);
    if remove {
        match std::fs::remove_file(&link) {
            Ok(()) => println!("removed {}", link.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                println!("{} was not installed", link.display())
            }
            Err(e) => return Err(e).with_context(|| format!("removing {}", link.display())),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let exe = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .context("finding this program's path")?;
    if std::fs::symlink_metadata(&link).is_ok() {
        std::fs::remove_file(&link)
            .with_context(|| format!("replacing {} (are you root?)", link.display()))?;
    }
    std::os::unix::fs::symlink(&exe, &link).with_context(|| {
        format!(
            "linking {} to {} (are you root?)",
            link.display(),
            exe.display()
        )
    })?;
    println!(
        "installed {} -> {}: `mount -t fuse.mako mako:fs1 DIR` and fstab lines of type fuse.mako \
         now reach makod",
        link.display(),
        exe.display()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_what_mount_passes() {
        let a = parse(&args("mako:fs1 /tmp/x -n -o rw,noexec -t fuse.mako")).unwrap();
        assert_eq!(a.fs, "fs1");
        assert_eq!(a.dir, PathBuf::from("/tmp/x"));
        assert_eq!(a.options, "rw,noexec");
        let a = parse(&args("fs2 /m -sv -r -N 5")).unwrap();
        assert_eq!(
            (a.fs.as_str(), a.options.as_str(), a.verbose),
            ("fs2", "ro", true)
        );
        assert!(parse(&args("fs1")).is_err());
        assert!(parse(&args("mako: /x")).is_err());
    }
}
