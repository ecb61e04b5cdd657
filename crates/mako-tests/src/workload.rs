//! A journalled mixed workload for failure tests with real processes (issue 14): each
//! node's worker creates, overwrites (write + fsync), renames and unlinks files in a
//! directory of its own (`p<node>`) and in one shared by all (`shared`), and journals
//! the state of every name after each acknowledged operation, plus what the one
//! operation in flight (the one a failure interrupted) would leave. [`check_journal`]
//! then checks what a survivor sees against the journal. Also the helpers those tests
//! share: [`abort_fuse_connection`] and [`percentile`].

use crate::pattern;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a name holds, per the journal: the seed and length of its `pattern`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Content {
    pub seed: u64,
    pub len: usize,
}

/// What an operation the kill interrupted leaves a name as, if it happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Doubt {
    /// A rename or unlink: the name is as before or as this.
    Then(Option<Content>),
    /// A write: as before, or absent, or anything written so far.
    Any,
}

/// One node's journal: the state of its names (relative to the mount) after every
/// acknowledged operation, and what the one unacknowledged operation (the one the
/// kill interrupted) would leave, which may or may not have happened.
#[derive(Default)]
pub struct Journal {
    pub acked: BTreeMap<PathBuf, Option<Content>>,
    pub pending: Option<Vec<(PathBuf, Doubt)>>,
    /// Operations acknowledged (over all rounds).
    pub ops: u64,
    /// Names an operation changed or may have changed since the last `settle_touched`:
    /// what [`check_touched`] checks (a round's check need not read every name again).
    pub touched: std::collections::BTreeSet<PathBuf>,
}

/// One operation of a worker, timed.
#[derive(Clone, Copy, Debug)]
pub struct Timed {
    /// Start, relative to the round's start.
    pub start: Duration,
    pub took: Duration,
    /// In the shared directory (else in the node's own).
    pub shared: bool,
    pub what: &'static str,
}

impl Journal {
    /// Forget the names touched so far (every view of them was checked).
    pub fn settle_touched(&mut self) {
        self.touched.clear();
    }

    fn set_pending(&mut self, pending: Vec<(PathBuf, Doubt)>) {
        self.touched.extend(pending.iter().map(|(p, _)| p.clone()));
        self.pending = Some(pending);
    }

    /// The last name (in name order) the journal says holds acknowledged contents:
    /// a file its node wrote and fsynced, which a survivor may need its tokens for.
    pub fn last_written(&self) -> Option<(PathBuf, Content)> {
        self.acked
            .iter()
            .rev()
            .find_map(|(p, c)| c.map(|c| (p.clone(), c)))
    }
}

/// A worker's timed operations.
pub type Latencies = Arc<Mutex<Vec<Timed>>>;

pub fn write_synced(p: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(p)?;
    f.write_all(data)?;
    f.sync_all()
}

pub fn sync_dir(p: &Path) -> std::io::Result<()> {
    std::fs::File::open(p)?.sync_all()
}

/// The mixed workload of node `node` on `mount`, until `stop` or the first error
/// (the node was killed: its mount is gone). Names are the node's own (`p<node>/…`
/// and `shared/s<node>_…`), so the journals of different nodes never disagree.
#[allow(clippy::too_many_arguments)]
pub fn work(
    node: u32,
    mount: PathBuf,
    journal: Arc<Mutex<Journal>>,
    seq: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    latencies: Latencies,
    t0: Instant,
) -> Option<std::io::Error> {
    let private = PathBuf::from(format!("p{node}"));
    let shared = PathBuf::from("shared");
    while !stop.load(Ordering::SeqCst) {
        let n = seq.fetch_add(1, Ordering::SeqCst);
        let dir = if n.is_multiple_of(2) {
            &private
        } else {
            &shared
        };
        let name = |k: u64| dir.join(format!("s{node}_{k}"));
        // The operation: its post-state, then doing it.
        let existing: Vec<PathBuf> = {
            let j = journal.lock().unwrap();
            j.acked
                .iter()
                .filter(|(p, c)| c.is_some() && p.parent() == Some(dir.as_path()))
                .map(|(p, _)| p.clone())
                .collect()
        };
        let timed = |start: Instant, what: &'static str| {
            latencies.lock().unwrap().push(Timed {
                start: start - t0,
                took: start.elapsed(),
                shared: dir == &shared,
                what,
            })
        };
        let kind = n % 7;
        let (post, result): (Vec<(PathBuf, Option<Content>)>, _) =
            if kind == 5 && !existing.is_empty() {
                let from = existing[(n as usize / 7) % existing.len()].clone();
                let to = name(n);
                let c = journal.lock().unwrap().acked[&from];
                let post = vec![(from.clone(), None), (to.clone(), c)];
                journal.lock().unwrap().set_pending(
                    post.iter()
                        .map(|(p, c)| (p.clone(), Doubt::Then(*c)))
                        .collect(),
                );
                let start = Instant::now();
                let r = std::fs::rename(mount.join(&from), mount.join(&to))
                    .and_then(|_| sync_dir(&mount.join(dir)));
                timed(start, "rename");
                (post, r)
            } else if kind == 6 && existing.len() > 3 {
                let victim = existing[(n as usize / 7) % existing.len()].clone();
                let post = vec![(victim.clone(), None)];
                journal
                    .lock()
                    .unwrap()
                    .set_pending(vec![(victim.clone(), Doubt::Then(None))]);
                let start = Instant::now();
                let r = std::fs::remove_file(mount.join(&victim))
                    .and_then(|_| sync_dir(&mount.join(dir)));
                timed(start, "unlink");
                (post, r)
            } else {
                // Create (or overwrite an existing name) with new contents, fsynced.
                let target = if kind == 3 && !existing.is_empty() {
                    existing[(n as usize / 7) % existing.len()].clone()
                } else {
                    name(n)
                };
                let c = Content {
                    seed: (u64::from(node) << 40) | n,
                    len: [1_000usize, 70_000, 300_000, 1_200_000][(n % 4) as usize]
                        + (n as usize % 333),
                };
                let post = vec![(target.clone(), Some(c))];
                journal
                    .lock()
                    .unwrap()
                    .set_pending(vec![(target.clone(), Doubt::Any)]);
                let start = Instant::now();
                let r = write_synced(&mount.join(&target), &pattern(c.seed, c.len))
                    .and_then(|_| sync_dir(&mount.join(dir)));
                timed(start, "write");
                (post, r)
            };
        if let Err(e) = result {
            // Killed mid-operation (or its mount went away): the post-state is in
            // doubt and stays pending.
            return Some(e);
        }
        let mut j = journal.lock().unwrap();
        for (p, c) in post {
            j.acked.insert(p, c);
        }
        j.pending = None;
        j.ops += 1;
    }
    None
}

/// Checks `journal` against what `mount` shows; then makes the journal what is there
/// (the pending operation resolved either way; a name a write in doubt left with
/// other contents is removed, so that it is absent for everyone).
pub fn check_journal(node: u32, journal: &Mutex<Journal>, mount: &Path, seen_from: u32) {
    check_names(node, journal, mount, seen_from, false)
}

/// [`check_journal`] of the names touched since the last `Journal::settle_touched`
/// only (and the pending operation's): a round's check, cheap however long the run.
pub fn check_touched(node: u32, journal: &Mutex<Journal>, mount: &Path, seen_from: u32) {
    check_names(node, journal, mount, seen_from, true)
}

fn check_names(node: u32, journal: &Mutex<Journal>, mount: &Path, seen_from: u32, touched: bool) {
    let mut j = journal.lock().unwrap();
    let pending: BTreeMap<PathBuf, Doubt> =
        j.pending.take().unwrap_or_default().into_iter().collect();
    let mut names: Vec<PathBuf> = if touched {
        j.touched.iter().cloned().collect()
    } else {
        j.acked.keys().cloned().collect()
    };
    names.extend(pending.keys().cloned());
    names.sort();
    names.dedup();
    for name in names {
        let want = j.acked.get(&name).copied().flatten();
        let path = mount.join(&name);
        let got = match std::fs::read(&path) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!(
                "node {seen_from} reads node {node}'s {}: {e}",
                name.display()
            ),
        };
        let matches = |c: Option<Content>| match (&got, c) {
            (None, None) => true,
            (Some(b), Some(c)) => b.len() == c.len && *b == pattern(c.seed, c.len),
            _ => false,
        };
        let state = if matches(want) {
            want
        } else {
            match pending.get(&name) {
                Some(Doubt::Then(p)) if matches(*p) => *p,
                Some(Doubt::Any) => {
                    if got.is_some() {
                        std::fs::remove_file(&path).unwrap_or_else(|e| {
                            panic!("node {seen_from} removes {}: {e}", path.display())
                        });
                    }
                    None
                }
                doubt => panic!(
                    "node {seen_from} sees node {node}'s {} as {}, but the journal says \
                     {want:?} (acknowledged after fsync){}",
                    name.display(),
                    match &got {
                        None => "absent".to_string(),
                        Some(b) => format!("{} bytes starting {:?}", b.len(), &b[..b.len().min(8)]),
                    },
                    doubt
                        .map(|p| format!(", or {p:?} if its last operation happened"))
                        .unwrap_or_default()
                ),
            }
        };
        j.acked.insert(name, state);
    }
    // The pending operation is settled now: what the next check sees must be this.
}

/// Aborts the FUSE connection of `mount` (fusectl), as `umount -f` would: a makod
/// killed while its `mako-inval` thread was writing an entry invalidation for a
/// directory that one of our workers was creating in (the kernel holds the
/// directory's lock for that request) never finishes exiting — the invalidation
/// waits for the lock, the request for the dead makod — so its /dev/fuse stays open
/// and the worker hangs. Best effort: without fusectl that hang remains possible.
pub fn abort_fuse_connection(mount: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Some(dev) = info.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 4 && Path::new(f[4]) == mount).then(|| f[2].to_string())
    }) else {
        return;
    };
    let minor = dev.rsplit(':').next().unwrap_or_default();
    let _ = std::fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), "1");
}

pub fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}
