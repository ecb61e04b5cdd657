//! Real processes: `mako fsck` against a file system made by `mako up` (with the
//! `fake_makod` example as the daemon): refusal while mounted, the online mode's
//! report from the daemon, usage errors, JSON progress and report, and the exit codes of a
//! check, a repair and the clean check after it.

use std::io::{Read, Seek, SeekFrom, Write};
mod common;

use common::{code, mako, setup, text};
use std::path::PathBuf;

/// Flip one byte of a disk image file.
fn flip(path: &PathBuf, offset: u64) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0x10;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&b).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn fsck_exit_codes_and_refusal_while_mounted() {
    let Some(s) = setup(None) else { return };
    let mp = s.mountpoint.display().to_string();
    let out = mako(
        &s,
        &[
            "up",
            "--disks",
            "3",
            "--disk-size",
            "256M",
            "--mountpoint",
            &mp,
        ],
    );
    assert!(out.status.success(), "{}", text(&out));

    // Mounted by a running makod: refused, naming the daemon and what to do.
    let out = mako(&s, &["fsck", "fs1", "-n"]);
    let t = text(&out);
    assert_eq!(code(&out), 8, "{t}");
    assert!(
        t.contains("mounted")
            && t.contains("pid")
            && t.contains("mako fs unmount fs1")
            && t.contains("--online"),
        "{t}"
    );

    // The online mode asks the daemon, prints its report and exits with its code.
    let out = mako(&s, &["fsck", "fs1", "--online", "--threads", "3"]);
    assert_eq!(code(&out), 4, "{}", text(&out));
    assert!(text(&out).contains("with 3 threads"), "{}", text(&out));
    let out = mako(&s, &["fsck", "fs1", "--online", "--json"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"fs_name\":\"fs1\""),
        "{}",
        text(&out)
    );

    // Usage errors exit 16.
    for args in [
        &["fsck", "fs1", "-n", "-y"][..],
        &["fsck"],
        &["fsck", "fs1", "--threads", "0"],
        &["fsck", "fs1", "--online", "-y"],
    ] {
        let out = mako(&s, args);
        assert_eq!(code(&out), 16, "{args:?}: {}", text(&out));
    }
    let out = mako(&s, &["fsck", "nosuch"]);
    assert_eq!(code(&out), 8, "{}", text(&out));
    assert!(
        text(&out).contains("no file system `nosuch`"),
        "{}",
        text(&out)
    );

    // Unmounted (makod still up): clean, with JSON progress on stderr.
    let out = mako(&s, &["fs", "unmount", "fs1"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = mako(&s, &["fsck", "fs1", "-n", "--threads", "2"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("No problems found"),
        "{}",
        text(&out)
    );
    let progress: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        progress
            .iter()
            .any(|p| p["phase"] == "inodes" && p["done"] == p["total"]),
        "{progress:?}"
    );
    let out = mako(&s, &["fsck", "fs1", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["exit_code"], 0);
    assert_eq!(report["mode"], "check");

    // Damage: a descriptor copy and a disk header.
    let out = mako(&s, &["down"]);
    assert!(out.status.success(), "{}", text(&out));
    flip(&s.data.join("disks/d1.img"), 4096 + 40);
    flip(&s.data.join("disks/d2.img"), 30);
    let out = mako(&s, &["fsck", "fs1"]);
    let t = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(code(&out), 4, "{}", text(&out));
    assert!(
        t.contains("[descriptor_copy]") && t.contains("[disk_header]"),
        "{t}"
    );
    let out = mako(&s, &["fsck", "fs1", "-y", "--json"]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["counts"]["descriptor_copy"]["fixed"], 1, "{report}");
    assert_eq!(report["counts"]["disk_header"]["fixed"], 1, "{report}");
    let out = mako(&s, &["fsck", "fs1", "-n"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}
