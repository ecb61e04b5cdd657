//! Real processes: `mako up`, `status`, `fs mount`, `diag`, `down` against the
//! `fake_makod` example (the control protocol without FUSE), in a temporary data
//! directory. The `mako` binary and the example are copied side by side so that
//! `mako up` finds `makod` next to itself.

mod common;

use common::{mako, setup, text, Setup};

fn mountpoint_arg(setup: &Setup) -> String {
    setup.mountpoint.display().to_string()
}

#[test]
fn up_status_diag_down() {
    let Some(s) = setup(None) else { return };
    let mp = mountpoint_arg(&s);
    let out = mako(
        &s,
        &[
            "up",
            "--disks",
            "2",
            "--disk-size",
            "512M",
            "--mountpoint",
            &mp,
            "--pagepool",
            "1G",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("Mako is up."), "{t}");
    assert!(t.contains(&mp), "{t}");
    assert!(t.contains("mako status"), "{t}");
    assert!(s.mountpoint.is_dir());
    assert!(s.data.join("disks/d1.img").exists());
    assert!(std::fs::read_to_string(s.data.join("config.toml"))
        .unwrap()
        .contains("pagepool"));

    let out = mako(&s, &["up"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("Mako is already up"), "{}", text(&out));

    let out = mako(&s, &["status"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("running, pid"), "{t}");
    assert!(t.contains("mounted"), "{t}");

    let out = mako(&s, &["fs", "show", "fs1"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("yes, on"), "{}", text(&out));

    for diag in ["iohist", "waiters", "counters", "stats", "tokens", "config"] {
        let out = mako(&s, &["diag", diag]);
        assert!(out.status.success(), "{diag}: {}", text(&out));
        let out = mako(&s, &["diag", diag, "--json"]);
        assert!(out.status.success(), "{diag}: {}", text(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
    }

    let out = mako(&s, &["fs", "unmount", "fs1"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = mako(&s, &["fs", "mount", "fs1"]);
    assert!(out.status.success(), "{}", text(&out));

    let out = mako(&s, &["down"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("stopped"), "{}", text(&out));
    assert!(!s.data.join("makod.pid").exists());

    let out = mako(&s, &["down"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("not running"), "{}", text(&out));

    let out = mako(&s, &["status"]);
    assert!(text(&out).contains("NOT RUNNING"), "{}", text(&out));
    let out = mako(&s, &["diag", "iohist"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("start it with `mako up`"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_daemon_that_dies_at_start_shows_its_log() {
    let script = "#!/bin/sh\necho 'makod: cannot open /dev/fuse' >&2\nexit 3\n";
    let Some(s) = setup(Some(script)) else { return };
    let mp = mountpoint_arg(&s);
    let out = mako(
        &s,
        &[
            "up",
            "--disks",
            "1",
            "--disk-size",
            "256M",
            "--mountpoint",
            &mp,
        ],
    );
    assert!(!out.status.success());
    let t = text(&out);
    assert!(t.contains("exited during start-up"), "{t}");
    assert!(t.contains("makod: cannot open /dev/fuse"), "{t}");
    assert!(!s.data.join("makod.pid").exists());
}

#[test]
fn commands_without_a_cluster_say_how_to_make_one() {
    let Some(s) = setup(None) else { return };
    for args in [&["status"][..], &["fs", "show"], &["disk", "show"]] {
        let out = mako(&s, args);
        assert!(!out.status.success(), "{args:?}");
        assert!(text(&out).contains("mako up"), "{args:?}: {}", text(&out));
    }
}
