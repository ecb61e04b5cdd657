//! Shared by the real-process CLI tests: a temporary data directory with `mako` and a
//! `makod` (the `fake_makod` example, or a script) side by side, so that `mako up`
//! finds `makod` next to itself. Dropping the setup kills a daemon the test left
//! running (a test that fails before its `mako down`), so nothing is left behind.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn built(relative: &str) -> PathBuf {
    let mako = PathBuf::from(env!("CARGO_BIN_EXE_mako"));
    mako.parent().unwrap().join(relative)
}

pub struct Setup {
    pub bin: PathBuf,
    pub data: PathBuf,
    pub mountpoint: PathBuf,
    pub home: PathBuf,
    _dir: tempfile::TempDir,
}

/// `makod`: `None` for the fake daemon, `Some(script)` for a shell script in its place.
/// Without the built fake daemon the test fails (or, with `MAKO_ALLOW_SKIP=1`, is
/// recorded as skipped and gets `None`).
pub fn setup(makod: Option<&str>) -> Option<Setup> {
    let fake = built("examples/fake_makod");
    if !fake.exists() {
        // libtest names each test's thread after the test.
        let test = std::thread::current()
            .name()
            .unwrap_or("a CLI test")
            .to_string();
        mako_tests::skip::cannot_run(
            &test,
            &format!(
                "{} is not built (`cargo test -p mako-cli` builds it; `cargo build --examples` too)",
                fake.display()
            ),
        );
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_mako"), bin.join("mako")).unwrap();
    match makod {
        None => {
            std::fs::copy(&fake, bin.join("makod")).unwrap();
        }
        Some(script) => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::write(bin.join("makod"), script).unwrap();
            std::fs::set_permissions(bin.join("makod"), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
    }
    Some(Setup {
        data: dir.path().join("data"),
        mountpoint: dir.path().join("mnt/fs1"),
        home: dir.path().join("home"),
        bin,
        _dir: dir,
    })
}

impl Drop for Setup {
    fn drop(&mut self) {
        let pid = std::fs::read_to_string(self.data.join("makod.pid"))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok());
        if let Some(pid) = pid.filter(|&p| p > 0) {
            // SAFETY: a plain kill(2) of the daemon this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

pub fn mako(s: &Setup, args: &[&str]) -> Output {
    Command::new(s.bin.join("mako"))
        .arg("--data-dir")
        .arg(&s.data)
        .args(args)
        .env("HOME", &s.home)
        .env_remove("MAKO_DATA_DIR")
        .output()
        .unwrap()
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn code(o: &Output) -> i32 {
    o.status.code().expect("exited")
}
