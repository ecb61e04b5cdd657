//! Crash consistency of mako-fs, model-based and deterministic.
//!
//! A seeded workload (creates, writes of every size class, truncates, renames,
//! unlinks, mkdir/rmdir, hard links, symlinks, xattrs, chmod, fsync of files and
//! directories, sync, unmount) runs on four `CrashDisk`s with no background threads,
//! so a seed fixes its sequence of sync points. A counting run finds the seed's sync
//! points and writes; then the seed runs again from scratch for each crash point (every
//! sync point, a sample of writes, torn or not, and a crash after the end), the crash
//! images are built by a loss policy and mounted, and the recovered file system must:
//!
//! (a) mount;
//! (b) pass a structural walk (readdir/lookup/getattr/readlink/getxattr/read to the end,
//!     nlink of directories = 2 + subdirectories, nlink of files = names found, inode and
//!     block maps agree with the tree) — and, before the mount, `mako fsck -n` (with the
//!     log laid over the disks) finds nothing but the unclean stop itself;
//! (c) equal, in names, kinds, modes, sizes, nlink, xattrs and symlink targets, the
//!     model after some operation i with last_durable <= i <= crash_op, where
//!     last_durable is the last fsync/sync/unmount that returned before the crash
//!     (fsync of anything commits every metadata change made before it);
//! (d) for that state, hold exactly the model's bytes in every file whose content was
//!     made durable (fsync of the file, or sync) and not changed since.
//!
//! Some cases use the recovered file system (write, sync, unmount) and check it once
//! more. Some crash again during recovery: the crash images are mounted a second time
//! with a crash at a sync point or write of that mount (sampled from the counts of the
//! first recovery mount of the same images), and what that crash left is recovered
//! and checked against the same allowed states, so replay must be idempotent and
//! restartable: the sampling reaches into log replay's own writes and syncs.
//!
//! What this asks of the recovery log, beyond "whole transactions": a file's size is
//! metadata that an fsync of anything commits (a write's new size is logged with the
//! write, not when write-back allocates its blocks), so after the crash the size is
//! the allowed state's even where the bytes were never written (they read as zeros,
//! and only durable files' bytes are compared); space freed by an uncommitted
//! operation must not be reused before that operation commits (a durable file of an
//! earlier state must keep its bytes); recovery leaves no inode or block in use that
//! the tree does not reach.
//!
//! Determinism: sync points and the order of writes are a function of the seed (see
//! `harness_a_seed_fixes_the_order_of_writes`); the printed replay command still names
//! the violation kind and repeats the case until it shows, in case a change brings
//! nondeterminism back.
//!
//! Running it (in CI with the defaults):
//!
//! ```text
//! cargo test --release -p mako-fs --test crash_consistency -- --exact crash_consistency_at_sync_and_write_points --nocapture
//! MAKO_CRASH_POINTS=20000 ...          # more crash points (default 1000)
//! MAKO_CRASH_SEED_BASE=100 ...         # other seeds (default 1)
//! MAKO_CRASH_OPS=200 ...               # operations per seed (default 120)
//! MAKO_CRASH_SEED=7 ...                # every crash point of one seed
//! MAKO_CRASH_SEED=7 MAKO_CRASH_POINT=sync:17 MAKO_CRASH_POLICY=random:5 ...  # one case
//! MAKO_CRASH_THREADS=1 ...             # threads running cases (default: all cores)
//! MAKO_CRASH_FSCK_EVERY=1 ...          # `mako fsck -n` on every recovered image (default: every 3rd)
//! ```
//!
//! Crash points are `sync:K`, `write:K`, `torn:K:SEED` or `end`; policies `keep-all`,
//! `drop-all` or `random:SEED`. A replay may add `MAKO_CRASH_RECOVERY_POINT` and
//! `MAKO_CRASH_RECOVERY_POLICY` (a crash during the recovery mount), `MAKO_CRASH_POST=1`
//! (use after recovery), `MAKO_CRASH_EXPECT` (the violation kind to wait for) and
//! `MAKO_CRASH_REPEAT` (attempts; see Determinism).
//!
//! A failure prints its case with the command that replays it alone.

mod crash;

use crash::check::{Allowed, Violation};
use crash::model::ROOT;
use crash::run::{
    self, base_images, cases_for_seed, count, disks_from, run_case, Case, CrashSpec, Outcome,
    RecoveryCrash, OPS_PER_SEED_DEFAULT,
};
use crash::workload::{Op, Plan};
use mako_disk::{CrashAt, LossPolicy};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T>
where
    T::Err: std::fmt::Display,
{
    let v = std::env::var(name).ok()?;
    match v.parse() {
        Ok(x) => Some(x),
        Err(e) => panic!("{name}={v:?}: {e}"),
    }
}

/// Run cases on `threads` threads; outcomes in case order.
fn run_cases(plans: &BTreeMap<u64, Arc<Plan>>, cases: Vec<Case>, threads: usize) -> Vec<Outcome> {
    let n = cases.len();
    let queue = Mutex::new(cases.into_iter().enumerate().collect::<VecDeque<_>>());
    let results = Mutex::new(Vec::with_capacity(n));
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let Some((i, case)) = queue.lock().unwrap().pop_front() else {
                    return;
                };
                let outcome = run_case(&plans[&case.seed], &case);
                results.lock().unwrap().push((i, outcome));
            });
        }
    });
    let mut r = results.into_inner().unwrap();
    r.sort_by_key(|(i, _)| *i);
    r.into_iter().map(|(_, o)| o).collect()
}

/// Summary of failed outcomes by violation kind (most frequent first), with examples
/// and their replay commands.
fn summarize(outcomes: &[Outcome]) -> String {
    let mut by_kind: BTreeMap<&str, Vec<&Outcome>> = BTreeMap::new();
    for o in outcomes {
        let kinds: BTreeSet<&str> = o.violations.iter().map(|v| v.kind.as_str()).collect();
        for k in kinds {
            by_kind.entry(k).or_default().push(o);
        }
    }
    let mut kinds: Vec<(&str, Vec<&Outcome>)> = by_kind.into_iter().collect();
    kinds.sort_by_key(|(k, os)| (std::cmp::Reverse(os.len()), *k));
    let mut s = String::from("\n  cases  kind\n");
    for (kind, os) in &kinds {
        s += &format!("  {:5}  {kind}\n", os.len());
    }
    for (kind, os) in &kinds {
        s += &format!("\n[{kind}] in {} cases\n", os.len());
        for o in os.iter().take(2) {
            s += &format!(
                "  e.g. {}\n    reproduce: {}\n    {}\n",
                o.case,
                o.case.reproduce(o.resolved_recovery, Some(kind)),
                o.context.replace('\n', "\n    ")
            );
            for v in o.violations.iter().filter(|v| v.kind == *kind).take(2) {
                s += &format!("    - {}\n", v.detail.replace('\n', "\n    "));
            }
        }
    }
    crash::workload::abbreviate(&s)
}

#[test]
fn crash_consistency_at_sync_and_write_points() {
    let ops: usize = env_parse("MAKO_CRASH_OPS").unwrap_or(OPS_PER_SEED_DEFAULT);
    let threads: usize = env_parse("MAKO_CRASH_THREADS").unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    });
    let start = Instant::now();
    let _ = base_images();
    // One case, as a failure report prints it.
    if let (Some(seed), Some(point)) = (
        env_parse::<u64>("MAKO_CRASH_SEED"),
        env_parse::<CrashSpec>("MAKO_CRASH_POINT"),
    ) {
        let policy = env_parse("MAKO_CRASH_POLICY").unwrap_or(LossPolicy::Random { seed: 1 });
        let recovery_crash = env_parse::<CrashAt>("MAKO_CRASH_RECOVERY_POINT").map(|at| {
            RecoveryCrash::At(
                at,
                env_parse("MAKO_CRASH_RECOVERY_POLICY").unwrap_or(LossPolicy::KeepAll),
            )
        });
        let case = Case {
            seed,
            ops,
            crash: point,
            policy,
            recovery_crash,
            post: env_parse::<u32>("MAKO_CRASH_POST") == Some(1),
        };
        let plan = Plan::generate(seed, ops);
        if let Ok(c) = count(&plan) {
            println!(
                "seed {seed}: {} sync points, {} writes without a crash (I/O shape {:016x})",
                c.sync_points, c.writes, c.io_shape
            );
        }
        // mako-fs flushes dirty inodes in hash-map order, so the order (and the disk
        // addresses) of the writes inside one write-back differ from run to run: a
        // crash at a write index, or a random loss policy, may hit other writes than
        // in the run that failed. With MAKO_CRASH_EXPECT (a violation kind, as the
        // failure report prints it), repeat until that kind shows, MAKO_CRASH_REPEAT
        // times at most.
        let expect: Option<String> = std::env::var("MAKO_CRASH_EXPECT").ok();
        let repeat: usize =
            env_parse("MAKO_CRASH_REPEAT").unwrap_or(if expect.is_some() { 50 } else { 1 });
        let mut attempt = 0;
        let o = loop {
            attempt += 1;
            let o = run_case(&plan, &case);
            let hit = match &expect {
                Some(k) => o.violations.iter().any(|v| &v.kind == k),
                None => !o.violations.is_empty(),
            };
            if hit || attempt >= repeat {
                break o;
            }
        };
        // The operations from a little before the last durable state to the crash.
        println!(
            "{case} (attempt {attempt} of at most {repeat})\n  {}",
            crash::workload::abbreviate(&o.context)
        );
        let (first, last) = o.allowed;
        for (i, op) in plan
            .ops
            .iter()
            .enumerate()
            .take(last)
            .skip(first.saturating_sub(3))
        {
            let mark = if i + 1 == first {
                "  <- last durable"
            } else {
                ""
            };
            println!(
                "    op {i}: {}{mark}",
                crash::workload::abbreviate(&op.describe(&plan.models[i]))
            );
        }
        assert!(
            o.violations.is_empty(),
            "\n{}",
            crash::workload::abbreviate(&o.report())
        );
        return;
    }
    // Every crash point of a few seeds.
    let target: usize = env_parse("MAKO_CRASH_POINTS").unwrap_or(1000);
    let seed_base: u64 = env_parse("MAKO_CRASH_SEED_BASE").unwrap_or(1);
    let only_seed: Option<u64> = env_parse("MAKO_CRASH_SEED");
    let (syncs_max, writes_max) = (100, 40);
    let mut plans = BTreeMap::new();
    let mut cases = Vec::new();
    let mut seed = only_seed.unwrap_or(seed_base);
    let mut setup_failures = Vec::new();
    while cases.len() < target || only_seed.is_some() {
        let plan = Arc::new(Plan::generate(seed, ops));
        match count(&plan) {
            Ok(c) => {
                println!(
                    "seed {seed}: {} ops, {} sync points, {} writes",
                    ops, c.sync_points, c.writes
                );
                cases.extend(cases_for_seed(seed, ops, &c, syncs_max, writes_max));
            }
            Err(v) => setup_failures.push((seed, v)),
        }
        plans.insert(seed, plan);
        if only_seed.is_some() || plans.len() > 10_000 {
            break;
        }
        seed += 1;
    }
    assert!(setup_failures.is_empty(), "the workload fails without a crash (a file system bug, or a harness bug):\n{setup_failures:#?}");
    let total = cases.len();
    let outcomes = run_cases(&plans, cases, threads);
    let failed: Vec<Outcome> = outcomes
        .into_iter()
        .filter(|o| !o.violations.is_empty())
        .collect();
    println!(
        "crash consistency: {total} crash points over {} seeds of {ops} ops on {threads} threads in {:.1} s: {} failed",
        plans.len(),
        start.elapsed().as_secs_f64(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {total} crash cases failed; by kind:{}",
        failed.len(),
        summarize(&failed)
    );
}

// ---- the harness's own tests (always on) ------------------------------------------

/// Cases that must pass on any file system that keeps what sync and unmount wrote:
/// crashes after a clean unmount, under every policy, with a crash during recovery and
/// with use after recovery.
#[test]
fn harness_passes_crashes_after_a_clean_unmount() {
    for seed in [101u64, 102] {
        let plan = Plan::generate(seed, 80);
        count(&plan).expect("the workload runs without a crash");
        let mut cases = Vec::new();
        for (i, policy) in [
            LossPolicy::KeepAll,
            LossPolicy::DropAll,
            LossPolicy::Random { seed: 3 },
        ]
        .into_iter()
        .enumerate()
        {
            let recovery_crash = match i {
                0 => None,
                1 => Some(RecoveryCrash::At(
                    CrashAt::Sync(1),
                    LossPolicy::Random { seed: 9 },
                )),
                _ => Some(RecoveryCrash::At(
                    CrashAt::Write {
                        index: 0,
                        torn_seed: Some(4),
                    },
                    LossPolicy::KeepAll,
                )),
            };
            cases.push(Case {
                seed,
                ops: 80,
                crash: CrashSpec::AfterEnd,
                policy,
                recovery_crash,
                post: i != 1,
            });
        }
        for case in cases {
            let o = run_case(&plan, &case);
            assert!(
                o.violations.is_empty(),
                "a crash after a clean unmount must pass:\n{}",
                o.report()
            );
            assert_eq!(
                o.allowed,
                (80, 80),
                "after a returned unmount only the final state is allowed"
            );
            assert_eq!(
                o.resolved_recovery.is_some(),
                case.recovery_crash.is_some(),
                "the crash during recovery ran"
            );
        }
    }
}

/// The sync points, before each op and in all, are a function of the seed alone (one
/// sync per disk in every fsync, sync and unmount, nothing in the background).
#[test]
fn harness_a_seed_fixes_the_sync_points() {
    let plan = Plan::generate(103, 80);
    let a = count(&plan).expect("run");
    let b = count(&plan).expect("run");
    assert_eq!(a.sync_points, b.sync_points);
    let syncs = |c: &run::Counts| c.op_start.iter().map(|x| x.0).collect::<Vec<_>>();
    assert_eq!(syncs(&a), syncs(&b), "sync points before each op");
    assert!(
        a.sync_points > 8,
        "the workload syncs ({} sync points)",
        a.sync_points
    );
}

/// Not only the sync points: the same writes, at the same places, in the same order.
/// mako-fs writes data back in inode order (`workers::sync_all`) and logs indirect and
/// directory blocks in key order (`journal` snapshot), so data blocks get the same
/// addresses and the log the same images in every run of a seed.
#[test]
fn harness_a_seed_fixes_the_order_of_writes() {
    let plan = Plan::generate(103, 80);
    let a = count(&plan).expect("run");
    let b = count(&plan).expect("run");
    assert_eq!(
        a.io_shape, b.io_shape,
        "same seed, other I/O positions or order"
    );
}

/// A hand-made plan whose final state is known, and its clean images after unmount.
fn known_plan() -> (Plan, Vec<Vec<u8>>) {
    let d = 1;
    let mut ops = vec![Op::Mkdir {
        parent: ROOT,
        name: b"dir".to_vec(),
        perm: 0o755,
        new: d,
    }];
    let mut next = 2;
    for i in 0..80 {
        ops.push(Op::Create {
            parent: d,
            name: format!("entry-{i:03}-with-a-long-name-for-directory-blocks").into_bytes(),
            perm: 0o644,
            new: next,
        });
        next += 1;
    }
    let f = next;
    ops.push(Op::Create {
        parent: ROOT,
        name: b"f".to_vec(),
        perm: 0o640,
        new: f,
    });
    ops.push(Op::Write {
        file: f,
        offset: 0,
        len: 200_000,
        seed: 77,
    });
    ops.push(Op::SetXattr {
        node: f,
        name: b"user.a".to_vec(),
        value: b"value".to_vec(),
    });
    ops.push(Op::Link {
        file: f,
        parent: d,
        name: b"f-link".to_vec(),
    });
    ops.push(Op::Symlink {
        parent: ROOT,
        name: b"s".to_vec(),
        target: b"dir/f-link".to_vec(),
        new: f + 1,
    });
    ops.push(Op::Fsync { node: f });
    ops.push(Op::Sync);
    ops.push(Op::Unmount);
    let plan = Plan::from_ops(900, ops);
    let (ctl, disks) = disks_from(base_images().clone());
    let ran = run::run_workload(&plan, &ctl, disks);
    assert!(ran.violations.is_empty(), "{:?}", ran.violations);
    assert_eq!(ctl.unsynced_writes(), 0);
    (plan, ctl.durable_images())
}

fn kinds(v: &[Violation]) -> Vec<&str> {
    v.iter().map(|x| x.kind.as_str()).collect()
}

/// The checker must notice a model that differs from the disks in each compared field.
#[test]
fn harness_checker_catches_a_wrong_model() {
    let (plan, images) = known_plan();
    let n = plan.ops.len();
    let no_dirty = BTreeSet::new();
    let right = Allowed {
        plan: &plan,
        first: n,
        last: n,
        dirty: &no_dirty,
    };
    assert!(
        run::check_images(&images, &right).is_empty(),
        "the right model passes: {:?}",
        run::check_images(&images, &right)
    );
    type Mutation = (&'static str, &'static str, fn(&mut crash::model::Model));
    let mutations: [Mutation; 8] = [
        (
            "a missing name",
            "namespace: name present that no allowed state has",
            |m| {
                let d = m.lookup(ROOT, b"dir").unwrap();
                let e = b"entry-005-with-a-long-name-for-directory-blocks".to_vec();
                let mid = m.lookup(d, &e).unwrap();
                m.remove(d, &e);
                assert!(!m.nodes.contains_key(&mid));
            },
        ),
        ("an extra name", "namespace: durable file missing", |m| {
            m.create(
                ROOT,
                b"extra",
                0o644,
                crash::model::Body::File(Default::default()),
            );
        }),
        (
            "a rename",
            "namespace: name present that no allowed state has",
            |m| m.rename(ROOT, b"f", ROOT, b"g"),
        ),
        (
            "a mode",
            "namespace: mode differs from every allowed state",
            |m| {
                let f = m.lookup(ROOT, b"f").unwrap();
                m.chmod(f, 0o600);
            },
        ),
        (
            "a size",
            "namespace: size differs from every allowed state",
            |m| {
                let f = m.lookup(ROOT, b"f").unwrap();
                m.truncate(f, 199_999);
            },
        ),
        (
            "an xattr",
            "namespace: xattrs differs from every allowed state",
            |m| {
                let f = m.lookup(ROOT, b"f").unwrap();
                m.set_xattr(f, b"user.a", b"other");
            },
        ),
        (
            "a symlink target",
            "namespace: symlink target differs from every allowed state",
            |m| {
                let s = m.lookup(ROOT, b"s").unwrap();
                m.node_mut(s).body = crash::model::Body::Symlink(b"dir/f-lonk".to_vec());
            },
        ),
        ("file content", "durable file content differs", |m| {
            let f = m.lookup(ROOT, b"f").unwrap();
            m.write(f, 100_000, &[0xee; 3]);
        }),
    ];
    for (what, expected_kind, mutate) in mutations {
        let mut model = (*plan.models[n]).clone();
        mutate(&mut model);
        let mut wrong = Plan::from_ops(plan.seed, Vec::new());
        wrong.canons[0] = Arc::new(model.canon());
        wrong.models[0] = Arc::new(model);
        let allowed = Allowed {
            plan: &wrong,
            first: 0,
            last: 0,
            dirty: &no_dirty,
        };
        let v = run::check_images(&images, &allowed);
        assert!(
            v.iter().any(|x| x.kind.starts_with(expected_kind)),
            "a model with {what} changed must fail with [{expected_kind}…], got {:#?}",
            v
        );
    }
    // A file that was not durable is not compared byte for byte.
    let f_mid = plan.models[n].lookup(ROOT, b"f").unwrap();
    let mut model = (*plan.models[n]).clone();
    model.write(f_mid, 100_000, &[0xee; 3]);
    let mut wrong = Plan::from_ops(plan.seed, Vec::new());
    wrong.canons[0] = Arc::new(model.canon());
    wrong.models[0] = Arc::new(model);
    let dirty = BTreeSet::from([f_mid]);
    assert!(run::check_images(
        &images,
        &Allowed {
            plan: &wrong,
            first: 0,
            last: 0,
            dirty: &dirty
        }
    )
    .is_empty());
}

/// The checker must notice damaged disks: a lost data write of a durable file, a
/// corrupt directory block, a block freed in the allocation map.
#[test]
fn harness_checker_catches_damaged_images() {
    let (plan, images) = known_plan();
    let n = plan.ops.len();
    let no_dirty = BTreeSet::new();
    let allowed = Allowed {
        plan: &plan,
        first: n,
        last: n,
        dirty: &no_dirty,
    };
    // Where things are: mount a copy and drop it without unmounting (writes nothing
    // to `images`).
    let (f_blocks, dir_blocks, f_inode_da, f_ino) = {
        let (_ctl, disks) = disks_from(images.clone());
        let m = mako_fs::mount::mount_disks(disks, run::config(), 0).expect("mount clean images");
        let f = m.fs.lookup(mako_fs::fs::ROOT_INO, b"f").unwrap().ino;
        let d = m.fs.lookup(mako_fs::fs::ROOT_INO, b"dir").unwrap().ino;
        let inode_file = m.core().metadata_inodes().inode_file;
        let da = m
            .core()
            .metafile_da(inode_file, f * m.core().inode_bytes() as u64)
            .unwrap();
        (
            m.fs.block_list(f).unwrap(),
            m.fs.block_list(d).unwrap(),
            da,
            f,
        )
    };
    assert!(
        !f_blocks.is_empty() && !dir_blocks.is_empty(),
        "f and dir have blocks: {f_blocks:?} {dir_blocks:?}"
    );
    let byte = |da: mako_format::DiskAddress| (da.disk() as usize, da.byte_offset() as usize);

    // 1. The second data block of f lost its write (zeros).
    let mut lost = images.clone();
    let (disk, off) = byte(f_blocks[1].1);
    lost[disk][off..off + 4096].fill(0);
    let v = run::check_images(&lost, &allowed);
    assert!(
        kinds(&v).contains(&"durable file content differs"),
        "{v:#?}"
    );

    // 2. A directory block with a flipped byte.
    let mut corrupt = images.clone();
    let (disk, off) = byte(dir_blocks[0].1);
    corrupt[disk][off + 100] ^= 0x40;
    let v = run::check_images(&corrupt, &allowed);
    assert!(
        kinds(&v).contains(&"bad metadata (checksum, identity or encoding)"),
        "a corrupt directory block must be noticed: {v:#?}"
    );

    // 3. The inode of f (two names) says three links.
    let mut nlink = images.clone();
    let (disk, off) = byte(f_inode_da);
    let ib = 4096;
    let loc = mako_format::error::Location::Memory;
    let mut inode =
        mako_format::inode::Inode::decode(&nlink[disk][off..off + ib], ib as u32, f_ino, loc)
            .expect("decode inode of f");
    assert_eq!(inode.nlink, 2);
    inode.nlink = 3;
    nlink[disk][off..off + ib].copy_from_slice(&inode.encode(ib as u32).unwrap());
    let v = run::check_images(&nlink, &allowed);
    assert!(
        kinds(&v).contains(&"file nlink differs from the names found"),
        "{v:#?}"
    );

    // 4. Images from before the last sync (the sync "returned" but its writes are lost):
    // the namespace matches no allowed state.
    let (ctl, disks) = disks_from(base_images().clone());
    let ran = run::run_workload(
        &Plan::from_ops(plan.seed, [plan.ops[..2].to_vec(), vec![Op::Sync]].concat()),
        &ctl,
        disks,
    );
    assert!(ran.violations.is_empty());
    ctl.crash_now();
    let v = run::check_images(&ctl.crash_images(LossPolicy::DropAll), &allowed);
    assert!(v.iter().any(|x| x.kind.starts_with("namespace")), "{v:#?}");
}

/// The workload reaches every layout the recovery log will have to get right: file
/// data in the inode, in a fragment, in full blocks and behind indirect blocks;
/// symlink targets in the inode and in a block; directories in the inode and in
/// blocks. Counted over the states the seeds pass through (the in-memory inodes after
/// every operation; allocation happens at write-back, so layouts show after fsync/sync).
#[test]
fn harness_workload_reaches_every_layout() {
    use mako_format::inode::InodeContent;
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for seed in [1u64, 2, 3] {
        let plan = Plan::generate(seed, OPS_PER_SEED_DEFAULT);
        let (_ctl, disks) = disks_from(base_images().clone());
        let mut exec = crash::workload::Executor::new(
            mako_fs::mount::mount_disks(disks, run::config(), 0).expect("mount"),
        );
        for (i, op) in plan.ops.iter().enumerate() {
            exec.apply(op)
                .unwrap_or_else(|e| panic!("seed {seed}: {}: {e}", op.describe(&plan.models[i])));
            let Some(m) = exec.mounted.as_ref() else {
                break;
            };
            let fs = &m.fs;
            for &ino in exec.inos.values() {
                let Ok(inode) = fs.raw_inode(ino) else {
                    continue;
                }; // removed since
                let kind = crash::model::Kind::from_mode(inode.mode);
                if !inode.xattr_index.is_null() {
                    *seen
                        .entry("extended attributes in xattr blocks")
                        .or_default() += 1;
                }
                let class = match (kind, &inode.content) {
                    (Some(crash::model::Kind::File), InodeContent::InlineData(d))
                        if !d.is_empty() =>
                    {
                        "file data in the inode"
                    }
                    (Some(crash::model::Kind::File), InodeContent::Pointers(_))
                        if inode.depth > 0 =>
                    {
                        "file behind indirect blocks"
                    }
                    (Some(crash::model::Kind::File), InodeContent::Pointers(_))
                        if inode.last_block_subblocks > 0 =>
                    {
                        "file ending in a fragment"
                    }
                    (Some(crash::model::Kind::File), InodeContent::Pointers(_))
                        if inode.size >= 64 << 10 =>
                    {
                        "file of full blocks"
                    }
                    (Some(crash::model::Kind::Symlink), InodeContent::InlineData(_)) => {
                        "symlink target in the inode"
                    }
                    (Some(crash::model::Kind::Symlink), InodeContent::Pointers(_)) => {
                        "symlink target in a block"
                    }
                    (Some(crash::model::Kind::Dir), InodeContent::InlineDir(e))
                        if !e.is_empty() =>
                    {
                        "directory in the inode"
                    }
                    (Some(crash::model::Kind::Dir), InodeContent::Pointers(_)) => {
                        "directory in blocks"
                    }
                    _ => continue,
                };
                *seen.entry(class).or_default() += 1;
            }
        }
    }
    let want = [
        "file data in the inode",
        "file ending in a fragment",
        "file of full blocks",
        "file behind indirect blocks",
        "symlink target in the inode",
        "symlink target in a block",
        "directory in the inode",
        "directory in blocks",
        "extended attributes in xattr blocks",
    ];
    for w in want {
        assert!(
            seen.contains_key(w),
            "the workload never reaches: {w} (seen {seen:?})"
        );
    }
}

/// Media damage in the middle of the log (see `crash/log_damage.rs`): crash images
/// of a few seeds, taken where the log holds several committed transactions, with
/// each transaction but the last damaged in turn (header or payload): the mount
/// refuses, fsck reports and repairs, and the result walks and checks clean. (A torn
/// last transaction, the normal end of a log after a crash, is every case of
/// `crash_consistency_at_sync_and_write_points`, whose mounts must all succeed.)
#[test]
fn media_damage_before_the_last_log_transaction_is_refused_and_repaired() {
    use crash::log_damage::{damage_and_check, log_chain};
    let mut failures = Vec::new();
    let mut checked = 0;
    for seed in 1u64..=3 {
        let plan = Plan::generate(seed, OPS_PER_SEED_DEFAULT);
        let c = count(&plan).expect("the workload runs without a crash");
        // A crash at the start of an operation, as late as gives a log of several
        // committed transactions (a sync or a full log checkpoints and empties it).
        let mut found = None;
        let mut last_point = None;
        for &(syncs, _) in c.op_start.iter().rev() {
            if last_point == Some(syncs) {
                continue;
            }
            last_point = Some(syncs);
            let (ctl, disks) = disks_from(base_images().clone());
            ctl.arm(CrashAt::Sync(syncs));
            let ran = run::run_workload(&plan, &ctl, disks);
            assert!(
                ran.violations.is_empty(),
                "seed {seed}: {:?}",
                ran.violations
            );
            ctl.crash_now();
            let images = ctl.crash_images(LossPolicy::KeepAll);
            let chain = log_chain(&images);
            if chain.len() >= 2 {
                println!(
                    "seed {seed}: crash at sync {syncs}, {} transactions in the log",
                    chain.len()
                );
                found = Some((images, chain));
                break;
            }
        }
        let (images, chain) = found.unwrap_or_else(|| {
            panic!("seed {seed}: no crash at the start of an operation leaves 2 transactions in the log")
        });
        // Every transaction but the last (at most 4 per seed, spread over the chain),
        // in its header and in its payload.
        let n = chain.len() - 1;
        let step = n.div_ceil(4).max(1);
        for (i, txn) in chain[..n].iter().enumerate().step_by(step) {
            for header in [true, false] {
                let what = format!(
                    "seed {seed}, transaction {i} of {} at LSN {} ({} damaged)",
                    chain.len(),
                    txn.lsn,
                    if header { "header" } else { "payload" }
                );
                failures.extend(damage_and_check(&images, *txn, header, &what));
                checked += 1;
            }
        }
    }
    println!("media damage: {checked} damaged logs checked");
    assert!(checked >= 8, "only {checked} damaged logs checked");
    assert!(
        failures.is_empty(),
        "{} violations:\n{}",
        failures.len(),
        failures
            .iter()
            .map(|v| format!("[{}] {}", v.kind, crash::workload::abbreviate(&v.detail)))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
