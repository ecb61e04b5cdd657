//! A test that cannot run here fails, unless the run opts out explicitly.
//!
//! A test that returns early because something it needs is missing (`/dev/fuse`, root,
//! a helper binary, a host feature) would pass without checking anything. So by default
//! [`cannot_run`] panics with what is missing and how to opt out. With
//! `MAKO_ALLOW_SKIP=1` it prints a loud SKIPPED line instead, appends one line
//! `test<TAB>reason` to the file named by `MAKO_SKIP_LOG` (when set), and the test
//! returns: `scripts/test` sets `MAKO_SKIP_LOG` and prints every skip, with its reason,
//! in its final summary.

use std::io::Write;

/// Set to `1` to let tests that cannot run here skip instead of fail.
pub const ALLOW_VAR: &str = "MAKO_ALLOW_SKIP";
/// The file each skip is recorded in (one line per skip), read by `scripts/test`.
pub const LOG_VAR: &str = "MAKO_SKIP_LOG";

/// True if this run lets tests skip (`MAKO_ALLOW_SKIP=1`).
pub fn allowed() -> bool {
    std::env::var(ALLOW_VAR).is_ok_and(|v| v == "1")
}

/// Test `test` cannot run here, because of `reason`: panics (the test fails) unless
/// skipping is allowed; then records the skip and returns, and the caller returns.
pub fn cannot_run(test: &str, reason: &str) {
    if !allowed() {
        panic!(
            "{test} cannot run here: {reason}. A test that cannot run fails; to skip such \
             tests instead, run with {ALLOW_VAR}=1 (each skip is then listed in the summary \
             of scripts/test)"
        );
    }
    eprintln!();
    eprintln!("************************************************************************");
    eprintln!("*** SKIPPED {test}: {reason} ({ALLOW_VAR}=1)");
    eprintln!("************************************************************************");
    eprintln!();
    record(test, reason);
}

/// Appends the skip to `$MAKO_SKIP_LOG`, one line in one write (O_APPEND), so that test
/// processes running at the same time do not mix their lines.
fn record(test: &str, reason: &str) {
    let Some(path) = std::env::var_os(LOG_VAR) else {
        return;
    };
    let line = format!(
        "{}\t{}\n",
        test.replace(['\t', '\n'], " "),
        reason.replace(['\t', '\n'], " ")
    );
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        // The skip is allowed, but it must not go unreported: fail instead.
        panic!(
            "{test}: cannot record the skip in {} ({e}); reason for the skip: {reason}",
            std::path::Path::new(&path).display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The environment is process-wide: both cases run in one test, one after the other.
    #[test]
    fn fails_by_default_and_records_when_allowed() {
        std::env::remove_var(ALLOW_VAR);
        let failed = std::panic::catch_unwind(|| cannot_run("some_test", "no /dev/fuse"));
        let message = failed.expect_err("must fail by default");
        let message = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(
            message.contains("some_test cannot run here: no /dev/fuse")
                && message.contains("MAKO_ALLOW_SKIP=1"),
            "{message}"
        );

        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skips");
        std::env::set_var(ALLOW_VAR, "1");
        std::env::set_var(LOG_VAR, &log);
        cannot_run("first_test", "not root");
        cannot_run("second_test", "no\tchattr");
        std::env::remove_var(ALLOW_VAR);
        std::env::remove_var(LOG_VAR);
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "first_test\tnot root\nsecond_test\tno chattr\n"
        );
    }
}
