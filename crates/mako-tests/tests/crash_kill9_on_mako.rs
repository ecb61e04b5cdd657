//! Real crashes: `kill -9` of makod at random moments while a workload (`mako-crashload`)
//! creates, rewrites, fsyncs, renames and unlinks files through the FUSE mount, then
//! `mako up` (which replays the recovery log) and the checks: every promise the file
//! system made before the kill is kept (`mako_tests::crashload::check`: fsynced
//! content, durable renames and unlinks, atomic renames) and the whole tree is readable.
//!
//! `MAKO_KILL9_ROUNDS` (default 50) sets the number of crashes; `MAKO_KILL9_SEED`
//! replays a run (the seed is printed first).

use mako_tests::cluster::{require_fuse, ClusterOptions, TestCluster};
use mako_tests::crashload;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn kill_9_at_random_moments_keeps_every_promise() {
    if !require_fuse("kill_9_at_random_moments_keeps_every_promise") {
        return;
    }
    let rounds = env_u64("MAKO_KILL9_ROUNDS").unwrap_or(50);
    let seed = env_u64("MAKO_KILL9_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            % 1_000_000
    });
    println!("kill -9 test: {rounds} rounds, MAKO_KILL9_SEED={seed}");
    let cluster = TestCluster::up(ClusterOptions {
        disks: 2,
        disk_size: "2G".into(),
        pagepool: "128M".into(),
        block_size: Some("1M".into()),
    })
    .expect("mako up");
    let load = cluster
        .mako_binary()
        .parent()
        .unwrap()
        .join("mako-crashload");
    assert!(
        load.exists(),
        "{} missing: build with `cargo build --workspace --bins`",
        load.display()
    );
    // One journal per round: an operation left uncertain by a crash (a rename that
    // returned but was not followed by an fsync) stays uncertain — later rounds' fsyncs
    // run in another daemon and cannot make it durable.
    let journal = |round: u64| cluster.root().join(format!("crash-journal-{round}"));
    let check_all = |from: u64, upto: u64| -> Result<usize, Vec<String>> {
        let mut n = 0;
        for r in from..=upto {
            n += crashload::check(&journal(r)).map_err(|p| {
                p.into_iter()
                    .map(|x| format!("round {r}: {x}"))
                    .collect::<Vec<_>>()
            })?;
        }
        Ok(n)
    };
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut replayed_rounds = 0;
    let mut fsck_saw_log = 0;
    let mut checked_total = 0;
    let started = Instant::now();
    for round in 0..rounds {
        let dir = cluster.mount().join(format!("round{round}"));
        let mut child = Command::new(&load)
            .arg(&dir)
            .arg("--journal")
            .arg(journal(round))
            .arg("--seed")
            .arg((seed + round).to_string())
            .stdout(Stdio::null())
            .spawn()
            .expect("start mako-crashload");
        // Kill at a random moment: early (mid-create) to late (many fsyncs done).
        let delay = Duration::from_millis(30 + next() % 1500);
        std::thread::sleep(delay);
        cluster
            .crash()
            .unwrap_or_else(|e| panic!("round {round}: crash: {e:#}"));
        // The workload sees the file system go away (ENOTCONN) and stops; only then is
        // the dead mount detached, so that it never carries on in the directory below.
        let t = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if t.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
        // fsck -n of the crashed disks, before the mount replays the log: it reads them
        // with the log laid over, so it must find nothing but the unclean stop itself.
        let out = cluster
            .mako(&["fsck", "fs1", "-n", "--threads", "2"])
            .unwrap();
        let unexpected: Vec<&str> = out
            .stdout
            .lines()
            .filter(|l| {
                l.starts_with('[')
                    && !l.starts_with("[log_replay]")
                    && !(l.starts_with("[descriptor_copy]") && l.contains("is stale"))
            })
            .collect();
        assert!(
            matches!(out.code, Some(0) | Some(4)) && unexpected.is_empty(),
            "round {round} (MAKO_KILL9_SEED={seed}): fsck -n after kill -9 finds damage:\n{}",
            out.text()
        );
        if out.code == Some(4) {
            fsck_saw_log += 1;
        }
        cluster.up_after_crash().unwrap_or_else(|e| {
            panic!(
                "round {round} (MAKO_KILL9_SEED={seed}): mako up after kill -9 failed: {e:#}\n{}",
                cluster.log_tail(30)
            )
        });
        // Every round checks its own promises and walks its own tree; every tenth
        // round (and the last) re-checks all earlier rounds too: a later daemon must not
        // undo what an earlier one made durable.
        let full = round % 10 == 9 || round + 1 == rounds;
        let first = if full { 0 } else { round };
        match check_all(first, round) {
            Ok(n) => checked_total = n,
            Err(problems) => {
                if let Some(keep) = std::env::var_os("MAKO_KILL9_KEEP") {
                    // Evidence for debugging: the daemon log and the journals.
                    let keep = std::path::PathBuf::from(keep);
                    let _ = std::fs::create_dir_all(&keep);
                    let _ =
                        std::fs::copy(cluster.data_dir().join("makod.log"), keep.join("makod.log"));
                    for r in 0..=round {
                        let _ = std::fs::copy(journal(r), keep.join(format!("journal-{r}")));
                    }
                }
                panic!(
                "round {round} (MAKO_KILL9_SEED={seed}, killed after {delay:?}): promises broken:\n  {}\nmakod.log:\n{}",
                problems.join("\n  "),
                cluster.log_tail(30)
            )
            }
        }
        // (The round's directory may not exist: the kill can come before its mkdir was
        // made durable.)
        let walk_root = if full || !dir.exists() {
            cluster.mount().to_path_buf()
        } else {
            dir.clone()
        };
        if let Err(problems) = crashload::walk(&walk_root) {
            panic!(
                "round {round} (MAKO_KILL9_SEED={seed}): the recovered tree is not readable:\n  {}",
                problems.join("\n  ")
            );
        }
        let log = std::fs::read_to_string(cluster.data_dir().join("makod.log")).unwrap_or_default();
        // The last mount's report: "recovery log of node 0: replayed N transactions …".
        let last_report = log
            .lines()
            .rev()
            .find(|l| l.contains("recovery log of node"))
            .unwrap_or("");
        if last_report.contains("replayed") {
            replayed_rounds += 1;
        }
    }
    // A clean stop after all that: fsck finds nothing at all, and everything still holds.
    cluster.down().expect("mako down");
    let out = cluster.mako(&["fsck", "fs1", "-n"]).unwrap();
    assert_eq!(
        out.code,
        Some(0),
        "fsck -n after a clean stop:\n{}",
        out.text()
    );
    cluster.up_again().expect("mako up");
    check_all(0, rounds.saturating_sub(1))
        .unwrap_or_else(|p| panic!("after a clean remount: {}", p.join("\n")));
    crashload::walk(cluster.mount())
        .unwrap_or_else(|p| panic!("after a clean remount: {}", p.join("\n")));
    println!(
        "{rounds} kill -9 rounds in {:.1} s: fsck -n found committed transactions to replay in {fsck_saw_log}, and found nothing else in any; {replayed_rounds} mounts replayed the log; {checked_total} promised files checked after the last",
        started.elapsed().as_secs_f64()
    );
    assert!(
        rounds == 0 || replayed_rounds > 0,
        "no mount ever replayed anything: the kills did not hit a live log"
    );
}
