//! Running crash cases: a seed's workload on crash-test disks, crashed at one point,
//! the crash images mounted again and checked; the choice of crash points for a seed;
//! the report of a failed case with the command that replays it.
//!
//! One case, step by step:
//! 1. Fresh `CrashDisk`s from the formatted base images, the controller armed.
//! 2. Mount (no background workers: dirty state reaches the disks only through fsync,
//!    sync and unmount, so a seed fixes the sequence of sync points) and run the
//!    seed's operations until the crash; the op that saw it is the crash op.
//! 3. Crash images by the case's loss policy; the crashed mount is dropped (its Drop
//!    writes nothing).
//! 4. Fresh disks from the images (optionally crashing again during this mount, then
//!    once more from those images), `fsck_clean`, mount (where log replay will run),
//!    structural walk, match against the allowed states, content of durable files.
//! 5. Optionally use the recovered file system (create, write, sync, unmount), mount
//!    again and check the namespace and contents once more.

use super::check::{fsck_clean, match_state, walk, Allowed, FsckVerdict, Violation};
use super::model::{Mid, Model, ROOT};
use super::workload::{Executor, Op, Plan};
use mako_disk::{CrashAt, CrashController, CrashDisk, Disk, LossPolicy};
use mako_format::disk_header::DiskUsage;
use mako_fs::mkfs::{format_disks, DiskMeta};
use mako_fs::mount::mount_disks;
use mako_fs::test_util::{small_config, small_params};
use mako_fs::{FsConfig, Mounted};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

pub const DISKS: usize = 4;
pub const DISK_BYTES: u64 = 16 << 20;
/// Operations per seed unless `MAKO_CRASH_OPS` says otherwise.
pub const OPS_PER_SEED_DEFAULT: usize = 120;

/// The mount configuration of every run: no background threads (determinism), a
/// pagepool large enough that the workload never waits for write-behind.
pub fn config() -> FsConfig {
    FsConfig {
        background_workers: false,
        pagepool_bytes: 64 << 20,
        ..small_config()
    }
}

/// The formatted disks every run starts from (formatted once per process).
pub fn base_images() -> &'static Vec<Vec<u8>> {
    static BASE: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    BASE.get_or_init(|| {
        let (ctl, disks) = disks_from((0..DISKS).map(|_| vec![0u8; DISK_BYTES as usize]).collect());
        let meta: Vec<DiskMeta> = (0..DISKS)
            .map(|i| DiskMeta {
                name: format!("d{i}"),
                pool: "system".into(),
                failure_group: i as i32 + 1,
                usage: DiskUsage::DataAndMetadata,
            })
            .collect();
        format_disks(disks, &meta, &small_params()).expect("format the crash-test disks");
        assert_eq!(ctl.unsynced_writes(), 0, "mkfs must leave nothing unsynced");
        ctl.durable_images()
    })
}

/// Crash-test disks holding `images`, on a fresh controller.
pub fn disks_from(images: Vec<Vec<u8>>) -> (Arc<CrashController>, Vec<Arc<dyn Disk>>) {
    let ctl = CrashController::new();
    let disks = images
        .into_iter()
        .enumerate()
        .map(|(i, img)| {
            Arc::new(CrashDisk::from_image(&ctl, &format!("d{i}"), img)) as Arc<dyn Disk>
        })
        .collect();
    (ctl, disks)
}

/// Where the workload crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashSpec {
    At(CrashAt),
    /// After the last operation (the unmount) returned.
    AfterEnd,
}

impl fmt::Display for CrashSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrashSpec::At(a) => write!(f, "{a}"),
            CrashSpec::AfterEnd => write!(f, "end"),
        }
    }
}

impl std::str::FromStr for CrashSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "end" {
            Ok(CrashSpec::AfterEnd)
        } else {
            s.parse().map(CrashSpec::At)
        }
    }
}

/// A crash during the recovery mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryCrash {
    /// Pick a point inside the recovery mount from its own counts, seeded.
    Sample(u64),
    /// At this point of the recovery mount (right after it, if the mount does not get
    /// there), keeping unsynced writes by the policy.
    At(CrashAt, LossPolicy),
}

/// One crash case.
#[derive(Debug, Clone)]
pub struct Case {
    pub seed: u64,
    pub ops: usize,
    pub crash: CrashSpec,
    pub policy: LossPolicy,
    pub recovery_crash: Option<RecoveryCrash>,
    /// Use the recovered file system and check it again.
    pub post: bool,
}

impl Case {
    /// The command that runs this case alone, repeating it until a violation of kind
    /// `expect` shows (the write order inside a write-back varies between runs).
    pub fn reproduce(
        &self,
        resolved_recovery: Option<(CrashAt, LossPolicy)>,
        expect: Option<&str>,
    ) -> String {
        let mut env = format!(
            "MAKO_CRASH_SEED={} MAKO_CRASH_OPS={} MAKO_CRASH_POINT={} MAKO_CRASH_POLICY={}",
            self.seed, self.ops, self.crash, self.policy
        );
        if let Some(kind) = expect {
            env += &format!(" MAKO_CRASH_EXPECT='{}'", kind.replace('\'', ""));
        }
        if let Some((at, p)) = resolved_recovery {
            env += &format!(" MAKO_CRASH_RECOVERY_POINT={at} MAKO_CRASH_RECOVERY_POLICY={p}");
        }
        if self.post {
            env += " MAKO_CRASH_POST=1";
        }
        format!("{env} cargo test --release -p mako-fs --test crash_consistency -- --exact crash_consistency_at_sync_and_write_points --nocapture")
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} ({} ops), crash point {}, policy {}",
            self.seed, self.ops, self.crash, self.policy
        )?;
        if let Some(r) = self.recovery_crash {
            write!(f, ", crash during recovery {r:?}")?;
        }
        Ok(())
    }
}

/// Where the workload stood when the crash came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Mount,
    Op(usize),
    End,
}

/// A workload run up to its crash.
pub struct Ran {
    pub stage: Stage,
    /// State index made durable by the last fsync/sync/unmount that returned.
    pub last_durable: usize,
    /// Files whose content is not known durable at the crash.
    pub dirty: BTreeSet<Mid>,
    pub violations: Vec<Violation>,
    /// Sync points and writes before each operation.
    pub op_start: Vec<(u64, u64)>,
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(non-string panic)".into())
}

/// Mount `disks` and run `plan` until the controller crashes (or to the end).
pub fn run_workload(plan: &Plan, ctl: &Arc<CrashController>, disks: Vec<Arc<dyn Disk>>) -> Ran {
    let mut ran = Ran {
        stage: Stage::Mount,
        last_durable: 0,
        dirty: BTreeSet::new(),
        violations: Vec::new(),
        op_start: Vec::new(),
    };
    let mounted = match catch_unwind(AssertUnwindSafe(|| mount_disks(disks, config(), 0))) {
        Err(p) => {
            ran.violations.push(Violation::new(
                "panic in mako-fs",
                format!("during the first mount: {}", panic_text(&p)),
            ));
            ctl.crash_now();
            return ran;
        }
        Ok(Err(e)) if ctl.is_crashed() => {
            let _ = e;
            return ran;
        }
        Ok(Err(e)) => {
            ran.violations.push(Violation::new(
                "mount of freshly formatted disks fails",
                e.to_string(),
            ));
            ctl.crash_now();
            return ran;
        }
        Ok(Ok(m)) => m,
    };
    if ctl.is_crashed() {
        ran.violations.push(Violation::new(
            "mount returned success although the disks crashed during it",
            String::new(),
        ));
        return ran;
    }
    let mut exec = Executor::new(mounted);
    for (i, op) in plan.ops.iter().enumerate() {
        ran.op_start.push((ctl.sync_points(), ctl.writes()));
        let result = catch_unwind(AssertUnwindSafe(|| exec.apply(op)));
        let crashed = ctl.is_crashed();
        if let Some(m) = op.content_change() {
            ran.dirty.insert(m);
        }
        let what = || op.describe(&plan.models[i]);
        match result {
            Err(p) => {
                ran.violations.push(Violation::new(
                    "panic in mako-fs",
                    format!("op {i} ({}): {}", what(), panic_text(&p)),
                ));
                ran.stage = Stage::Op(i);
                ctl.crash_now();
                return ran;
            }
            Ok(Ok(())) if crashed => {
                let kind = if op.is_durability_point() {
                    "fsync/sync/unmount returned success although the disks crashed during it"
                } else {
                    "operation returned success although a disk I/O failed during it"
                };
                ran.violations
                    .push(Violation::new(kind, format!("op {i} ({})", what())));
                ran.stage = Stage::Op(i);
                return ran;
            }
            Ok(Ok(())) => match op {
                Op::Fsync { node } => {
                    ran.dirty.remove(node);
                    ran.last_durable = i + 1;
                }
                Op::Sync | Op::Unmount => {
                    ran.dirty.clear();
                    ran.last_durable = i + 1;
                }
                _ => {}
            },
            Ok(Err(_)) if crashed => {
                ran.stage = Stage::Op(i);
                return ran;
            }
            Ok(Err(e)) => {
                ran.violations.push(Violation::new(
                    "operation failed without a crash",
                    format!("op {i} ({}): {e}", what()),
                ));
                ran.stage = Stage::Op(i);
                ctl.crash_now();
                return ran;
            }
        }
    }
    ran.stage = Stage::End;
    ran
}

/// Sync points and writes of a seed's whole run, without a crash.
pub struct Counts {
    pub sync_points: u64,
    pub writes: u64,
    /// `CrashController::io_shape_hash` of the run.
    pub io_shape: u64,
    pub op_start: Vec<(u64, u64)>,
}

pub fn count(plan: &Plan) -> Result<Counts, Vec<Violation>> {
    let (ctl, disks) = disks_from(base_images().clone());
    let ran = run_workload(plan, &ctl, disks);
    if !ran.violations.is_empty() {
        return Err(ran.violations);
    }
    assert_eq!(ran.stage, Stage::End);
    assert_eq!(
        ctl.unsynced_writes(),
        0,
        "seed {}: writes left unsynced after unmount",
        plan.seed
    );
    Ok(Counts {
        sync_points: ctl.sync_points(),
        writes: ctl.writes(),
        io_shape: ctl.io_shape_hash(),
        op_start: ran.op_start,
    })
}

/// The result of one case.
pub struct Outcome {
    pub case: Case,
    pub violations: Vec<Violation>,
    /// Where the crash came and what was allowed, for the report.
    pub context: String,
    pub resolved_recovery: Option<(CrashAt, LossPolicy)>,
    /// The allowed states (first..=last).
    pub allowed: (usize, usize),
}

impl Outcome {
    pub fn report(&self) -> String {
        let expect = self.violations.first().map(|v| v.kind.as_str());
        let mut s = format!(
            "crash case FAILED: {}\n  reproduce: {}\n  {}\n",
            self.case,
            self.case.reproduce(self.resolved_recovery, expect),
            self.context
        );
        for v in &self.violations {
            s += &format!("  [{}] {}\n", v.kind, v.detail);
        }
        s
    }
}

/// Run one case.
pub fn run_case(plan: &Plan, case: &Case) -> Outcome {
    let (ctl, disks) = disks_from(base_images().clone());
    if let CrashSpec::At(at) = case.crash {
        ctl.arm(at);
    }
    let ran = run_workload(plan, &ctl, disks);
    let mut violations = ran.violations;
    let mut not_reached = String::new();
    if !ctl.is_crashed() {
        match case.crash {
            // Sync points are a function of the seed: missing one is a harness bug.
            CrashSpec::At(at @ CrashAt::Sync(_)) => violations.push(Violation::new(
                "harness: crash point beyond the run",
                format!(
                    "{at}: the run ended after {} syncs and {} writes",
                    ctl.sync_points(),
                    ctl.writes()
                ),
            )),
            // The number of writes may vary by a few between runs (see
            // harness_a_seed_fixes_the_order_of_writes): crash after the end instead.
            CrashSpec::At(at) => {
                not_reached = format!(" ({at} not reached: this run had {} writes)", ctl.writes())
            }
            CrashSpec::AfterEnd => {}
        }
        ctl.crash_now();
    }
    let record = ctl.crash_record().expect("crashed");
    let (stage_text, last) = match ran.stage {
        Stage::Mount => ("during the first mount".to_string(), 0),
        Stage::Op(i) => (
            format!("during op {i} ({})", plan.ops[i].describe(&plan.models[i])),
            i + 1,
        ),
        Stage::End => ("after the last op".to_string(), plan.ops.len()),
    };
    let durable_text = match ran.last_durable {
        0 => "nothing since mkfs".to_string(),
        j => format!(
            "op {} ({})",
            j - 1,
            plan.ops[j - 1].describe(&plan.models[j - 1])
        ),
    };
    let mut context = format!(
        "{record}{not_reached}; {stage_text}\n  allowed states {}..={} (last fsync/sync/unmount that returned: {durable_text})",
        ran.last_durable, last
    );
    let images = ctl.crash_images(case.policy);
    drop(ctl); // its disks' memory: the images are all that is left of the crash
    let allowed = Allowed {
        plan,
        first: ran.last_durable,
        last,
        dirty: &ran.dirty,
    };
    let mut resolved_recovery = None;
    if violations.iter().all(|v| v.kind != "panic in mako-fs") {
        let r = recover_and_check(images, &allowed, case, &mut resolved_recovery);
        if let Some(j) = r.matched {
            context += &format!("; recovered state {j}");
        }
        violations.extend(r.violations);
    }
    Outcome {
        case: case.clone(),
        violations,
        context,
        resolved_recovery,
        allowed: (ran.last_durable, last),
    }
}

struct Recovered {
    violations: Vec<Violation>,
    matched: Option<usize>,
}

fn mount_recovered(
    disks: Vec<Arc<dyn Disk>>,
    v: &mut Vec<Violation>,
    when: &str,
) -> Option<Mounted> {
    if let FsckVerdict::Damaged(what) = fsck_clean(&disks) {
        v.push(Violation::new(
            "fsck finds damage",
            format!("{when}: {what}"),
        ));
    }
    match catch_unwind(AssertUnwindSafe(|| mount_disks(disks, config(), 0))) {
        Ok(Ok(m)) => Some(m),
        Ok(Err(e)) => {
            v.push(Violation::new(
                "mount fails after the crash",
                format!("{when}: {e}"),
            ));
            None
        }
        Err(p) => {
            v.push(Violation::new(
                "panic in mako-fs",
                format!("{when}, mounting: {}", panic_text(&p)),
            ));
            None
        }
    }
}

/// Steps 4 and 5 of a case.
fn recover_and_check(
    images: Vec<Vec<u8>>,
    allowed: &Allowed,
    case: &Case,
    resolved: &mut Option<(CrashAt, LossPolicy)>,
) -> Recovered {
    let mut v = Vec::new();
    // The crash images are needed again only for a crash during recovery.
    let again = case.recovery_crash.map(|_| images.clone());
    let (rctl, rdisks) = disks_from(images);
    let Some(m) = mount_recovered(rdisks, &mut v, "recovery mount") else {
        return Recovered {
            violations: v,
            matched: None,
        };
    };
    let mount_counts = (rctl.sync_points(), rctl.writes());
    let matched = check_mounted(&m, allowed, &mut v, "after recovery");
    // A crash during recovery is only worth trying when recovery itself went well:
    // otherwise it repeats what is already reported.
    if let (Some(rc), Some(images), true) = (case.recovery_crash, again, v.is_empty()) {
        // Crash during recovery: mount the same crash images again, crashing inside
        // that mount, and recover from what it left.
        let (at, policy) = match rc {
            RecoveryCrash::At(at, p) => (at, p),
            RecoveryCrash::Sample(seed) => {
                let mut rng = StdRng::seed_from_u64(seed);
                let at = if rng.gen_bool(0.5) && mount_counts.0 > 0 {
                    CrashAt::Sync(rng.gen_range(0..mount_counts.0))
                } else {
                    CrashAt::Write {
                        index: rng.gen_range(0..mount_counts.1.max(1)),
                        torn_seed: rng.gen_bool(0.5).then(|| rng.gen()),
                    }
                };
                (at, random_policy(&mut rng))
            }
        };
        *resolved = Some((at, policy));
        let (cctl, cdisks) = disks_from(images);
        cctl.arm(at);
        let crashed_mount = catch_unwind(AssertUnwindSafe(|| mount_disks(cdisks, config(), 0)));
        match &crashed_mount {
            Err(p) => v.push(Violation::new(
                "panic in mako-fs",
                format!("mount crashed during recovery: {}", panic_text(p)),
            )),
            Ok(Ok(_)) if cctl.is_crashed() => v.push(Violation::new(
                "mount returned success although the disks crashed during it",
                format!("recovery crash at {at}"),
            )),
            _ => {}
        }
        cctl.crash_now();
        drop(crashed_mount);
        let (_, disks2) = disks_from(cctl.crash_images(policy));
        if let Some(m2) = mount_recovered(disks2, &mut v, "mount after a crash during recovery") {
            check_mounted(
                &m2,
                allowed,
                &mut v,
                "after a crash during recovery and a second recovery",
            );
        }
    }
    if case.post && v.is_empty() {
        if let Some(j) = matched {
            post_recovery_use(m, rctl, allowed, j, &mut v);
            return Recovered {
                violations: v,
                matched,
            };
        }
    }
    drop(m);
    Recovered {
        violations: v,
        matched,
    }
}

/// Mount `images` and check them against `allowed` (no crash during recovery, no
/// post-recovery use): the harness's own tests feed it damaged images.
pub fn check_images(images: &[Vec<u8>], allowed: &Allowed) -> Vec<Violation> {
    let case = Case {
        seed: allowed.plan.seed,
        ops: allowed.plan.ops.len(),
        crash: CrashSpec::AfterEnd,
        policy: LossPolicy::KeepAll,
        recovery_crash: None,
        post: false,
    };
    recover_and_check(images.to_vec(), allowed, &case, &mut None).violations
}

/// Walk and match a mounted, recovered file system.
fn check_mounted(
    m: &Mounted,
    allowed: &Allowed,
    v: &mut Vec<Violation>,
    when: &str,
) -> Option<usize> {
    let before = v.len();
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut w = Vec::new();
        let found = walk(&m.fs, &mut w);
        let matched = if w.is_empty() {
            match_state(&m.fs, &found, allowed, &mut w)
        } else {
            None
        };
        if !w.is_empty() && matched.is_none() && !w.iter().any(|x| x.kind.starts_with("namespace"))
        {
            // The structure is damaged: still say how the namespace compares.
            let mut n = Vec::new();
            match_state(&m.fs, &found, allowed, &mut n);
            w.extend(
                n.into_iter()
                    .filter(|x| x.kind.starts_with("namespace"))
                    .map(|mut x| {
                        x.detail = format!("(with the structural damage above) {}", x.detail);
                        x
                    }),
            );
        }
        (w, matched)
    }));
    let matched = match r {
        Ok((w, matched)) => {
            v.extend(w);
            matched
        }
        Err(p) => {
            v.push(Violation::new(
                "panic in mako-fs",
                format!("walking the recovered file system: {}", panic_text(&p)),
            ));
            None
        }
    };
    for x in &mut v[before..] {
        if when != "after recovery" {
            x.kind = format!("{when}: {}", x.kind);
        }
    }
    matched
}

/// Use the recovered file system (a new directory, files written, sync, unmount), mount
/// it again and check that the namespace is the matched state plus the new names, and
/// that durable and new files hold their content: catches allocation maps that hand
/// out space still in use.
fn post_recovery_use(
    m: Mounted,
    rctl: Arc<CrashController>,
    allowed: &Allowed,
    j: usize,
    v: &mut Vec<Violation>,
) {
    let plan = allowed.plan;
    let mut model: Model = (*plan.models[j]).clone();
    // Model inodes to the recovered inode numbers, through the paths.
    let found_inos: HashMap<String, u64> = {
        let mut w = Vec::new();
        walk(&m.fs, &mut w)
            .canon
            .entries
            .into_iter()
            .map(|(p, e)| (p, e.mid))
            .collect()
    };
    let mut exec = Executor::new(m);
    for (p, e) in &plan.canons[j].entries {
        if let Some(&ino) = found_inos.get(p) {
            exec.inos.insert(e.mid, ino);
        }
    }
    let dir = model.next_mid;
    let mut ops = vec![Op::Mkdir {
        parent: ROOT,
        name: b"zz-post-recovery".to_vec(),
        perm: 0o755,
        new: dir,
    }];
    let big = dir + 1;
    ops.push(Op::Create {
        parent: dir,
        name: b"big".to_vec(),
        perm: 0o644,
        new: big,
    });
    ops.push(Op::Write {
        file: big,
        offset: 0,
        len: 300_000,
        seed: 1,
    });
    ops.push(Op::Write {
        file: big,
        offset: 5 << 20,
        len: 1000,
        seed: 2,
    });
    for i in 0..12u64 {
        let f = big + 1 + i;
        ops.push(Op::Create {
            parent: dir,
            name: format!("small-{i}").into_bytes(),
            perm: 0o600,
            new: f,
        });
        ops.push(Op::Write {
            file: f,
            offset: 0,
            len: 700 + 5000 * i as u32,
            seed: 10 + i,
        });
    }
    ops.push(Op::Sync);
    ops.push(Op::Unmount);
    for op in &ops {
        let desc = op.describe(&model);
        op.apply_to_model(&mut model);
        match catch_unwind(AssertUnwindSafe(|| exec.apply(op))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                v.push(Violation::new(
                    "post-recovery: operation fails",
                    format!("{desc}: {e}"),
                ));
                return;
            }
            Err(p) => {
                v.push(Violation::new(
                    "panic in mako-fs",
                    format!("post-recovery {desc}: {}", panic_text(&p)),
                ));
                return;
            }
        }
    }
    let images = rctl.durable_images();
    drop(rctl);
    let (_, disks) = disks_from(images);
    let Some(m) = mount_recovered(disks, v, "mount after post-recovery use") else {
        return;
    };
    let canon = Arc::new(model.canon());
    let plan2 = Plan {
        seed: plan.seed,
        ops: Vec::new(),
        models: vec![Arc::new(model)],
        canons: vec![canon],
    };
    // The new files reuse model inode numbers past state j, which the crashed run may
    // have used (and left dirty) for files of later states: only the old ones stay dirty.
    let dirty: BTreeSet<Mid> = allowed.dirty.iter().copied().filter(|&m| m < dir).collect();
    let allowed2 = Allowed {
        plan: &plan2,
        first: 0,
        last: 0,
        dirty: &dirty,
    };
    check_mounted(
        &m,
        &allowed2,
        v,
        "post-recovery (after writing, sync, unmount, mount)",
    );
    drop(m);
}

pub fn random_policy(rng: &mut StdRng) -> LossPolicy {
    match rng.gen_range(0..100) {
        0..=69 => LossPolicy::Random {
            seed: rng.gen_range(0..1_000_000),
        },
        70..=84 => LossPolicy::KeepAll,
        _ => LossPolicy::DropAll,
    }
}

/// The crash cases of one seed: every sync point (or `syncs_max` of them, seeded),
/// `writes_max` writes (half of them torn), and a crash after the end.
pub fn cases_for_seed(
    seed: u64,
    ops: usize,
    counts: &Counts,
    syncs_max: usize,
    writes_max: usize,
) -> Vec<Case> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc4a5_4c4a_5e00);
    let mut points: Vec<CrashSpec> = Vec::new();
    let n = counts.sync_points as usize;
    let mut syncs: Vec<u64> = (0..n as u64).collect();
    if n > syncs_max {
        // Keep the first and last sync points, sample the rest.
        let mut middle: Vec<u64> = (1..n as u64 - 1).collect();
        for i in (1..middle.len()).rev() {
            middle.swap(i, rng.gen_range(0..=i));
        }
        middle.truncate(syncs_max.saturating_sub(2));
        syncs = [vec![0, n as u64 - 1], middle].concat();
        syncs.sort();
    }
    points.extend(syncs.into_iter().map(|k| CrashSpec::At(CrashAt::Sync(k))));
    let w = counts.writes;
    let mut writes: BTreeSet<u64> = BTreeSet::new();
    while writes.len() < writes_max.min(w as usize) {
        writes.insert(rng.gen_range(0..w));
    }
    for k in writes {
        let torn_seed = rng.gen_bool(0.5).then(|| rng.gen_range(0..1_000_000));
        points.push(CrashSpec::At(CrashAt::Write {
            index: k,
            torn_seed,
        }));
    }
    points.push(CrashSpec::AfterEnd);
    points
        .into_iter()
        .map(|crash| Case {
            seed,
            ops,
            crash,
            policy: random_policy(&mut rng),
            recovery_crash: rng.gen_bool(0.08).then(|| RecoveryCrash::Sample(rng.gen())),
            post: rng.gen_bool(0.2),
        })
        .collect()
}
