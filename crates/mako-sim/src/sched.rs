//! The deterministic scheduler: simulated tasks are OS threads, but exactly one runs
//! at a time and the scheduler alone picks which, from a seeded random stream, at the
//! points where a task calls into `mako_diag::sched` (a lock, a condition variable, a
//! disk I/O, a message, a timer). Time is simulated: it advances only when no task
//! can run, to the next timer. So a run is a pure function of its seed, and a failing
//! seed replays bit-for-bit (`SimReport::trace` is the proof: the hash of every
//! scheduling decision).
//!
//! Blocking: a task that cannot go on (a contended lock) is parked as `Blocked` and
//! becomes eligible again once another task has made progress; it then re-checks.
//!
//! Choosing costs O(log n) in the number of tasks (thousands of simulated nodes):
//! the eligible tasks are kept in an indexed set (`EligibleSet`, a Fenwick tree) and
//! the seeded draw picks the k-th of them in spawn order, the same task a scan of
//! every task would pick, so the schedule of a seed is what it always was.
//! When no task is runnable, none is eligible and no timer is pending, the tasks are
//! deadlocked: the run fails with every blocked task and what it waits on.
//!
//! A task must only wait through the scheduler. If one blocks its thread some other
//! way (a raw lock held across a scheduling point, a real sleep), nothing else can
//! run; the watchdog notices that no decision was made for `hang_timeout` of real
//! time and fails the run naming the task that holds the processor.

use crate::eligible::EligibleSet;
use crate::rng::SimRng;
use mako_diag::sched::TaskScheduler;
use std::collections::BinaryHeap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Index of a task in its simulation, in spawn order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId(pub usize);

/// Knobs of one simulation run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Probability that a preemption point switches to another task.
    pub preempt_probability: f64,
    /// Real time without a scheduling decision after which the run is declared hung.
    pub hang_timeout: Duration,
    /// Stack size of a task's thread.
    pub stack_bytes: usize,
    /// Most scheduling decisions before the run is declared livelocked.
    pub steps_max: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            preempt_probability: 0.2,
            hang_timeout: Duration::from_secs(120),
            stack_bytes: 4 << 20,
            steps_max: 50_000_000,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TaskState {
    /// Spawned, waiting for its first turn.
    Runnable,
    /// Waiting for another task to make progress (`since`: the progress count when it
    /// blocked).
    Blocked {
        since: u64,
        on: &'static str,
    },
    /// Waiting for simulated time.
    Sleeping,
    Done,
}

struct Baton {
    go: Mutex<bool>,
    cv: Condvar,
}

struct Task {
    name: String,
    state: TaskState,
    baton: Arc<Baton>,
    /// Where the task last blocked, with `MAKO_SIM_BLOCK_TRACE` set (a deadlock
    /// report then shows every blocked task's stack).
    blocked_at: Option<String>,
    /// What a task blocked in `block_until_ready` waits for: while it is false, a turn
    /// of the task would only block it again, and the scheduler does that in its place.
    /// Set only while the task is blocked in that call (whose frame owns the closure).
    watch: Option<&'static (dyn Fn() -> bool + Sync)>,
    /// The simulated node the task belongs to (None: the driver, the cluster's own
    /// machinery). A paused group's tasks are not chosen (`Sim::pause_group`).
    group: Option<u32>,
    /// In a `kernel_section`: work the operating system finishes for the task (an I/O
    /// it submitted) goes on while its group is paused.
    kernel: bool,
}

/// A timer: wake `task` at `at` (ties broken by `seq`, the order timers were set).
#[derive(PartialEq, Eq)]
struct Timer {
    at: Duration,
    seq: u64,
    task: TaskId,
}

impl Ord for Timer {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Min-heap on (at, seq).
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}
impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

struct State {
    rng: SimRng,
    now: Duration,
    tasks: Vec<Task>,
    running: Option<TaskId>,
    progress: u64,
    /// Tasks that may be picked: runnable, or blocked before the last progress.
    eligible: EligibleSet,
    /// Tasks that blocked at the current `progress`: eligible at its next step.
    blocked_now: Vec<usize>,
    timers: BinaryHeap<Timer>,
    timer_seq: u64,
    trace: u64,
    steps: u64,
    handoffs: u64,
    failure: Option<String>,
    finished: bool,
    last_decision: Instant,
    /// Groups (simulated nodes) whose tasks do not run now: a stopped process.
    paused: std::collections::BTreeSet<u32>,
}

pub(crate) struct Inner {
    state: Mutex<State>,
    /// The driver (the thread that called `run`) waits here for the end.
    driver: Condvar,
    config: SimConfig,
    seed: u64,
}

/// A deterministic simulation: spawn tasks, then `run` it.
#[derive(Clone)]
pub struct Sim {
    pub(crate) inner: Arc<Inner>,
}

/// How a successful run went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimReport {
    pub seed: u64,
    /// Simulated time at the end.
    pub elapsed: Duration,
    /// Scheduling decisions made.
    pub steps: u64,
    /// Hash of every scheduling decision: equal for two runs of one seed.
    pub trace: u64,
    pub tasks: usize,
    /// Decisions that woke another task's thread (the rest kept the running task, or
    /// were turns of a blocked task whose condition was still false, taken for it).
    pub handoffs: u64,
}

/// Why a run failed: a deadlock, a task that panicked, a hang, a livelock.
#[derive(Clone, Debug)]
pub struct SimFailure {
    pub seed: u64,
    pub message: String,
    pub elapsed: Duration,
}

impl std::fmt::Display for SimFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "simulation seed {} failed at simulated time {:?}: {}",
            self.seed, self.elapsed, self.message
        )
    }
}

fn mix(trace: u64, a: u64, b: u64) -> u64 {
    let mut h = trace ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h = h.rotate_left(27) ^ b.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    h.wrapping_mul(0x1656_67b1_9e37_79f9)
}

impl Sim {
    pub fn new(seed: u64, config: SimConfig) -> Sim {
        Sim {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    rng: SimRng::new(seed),
                    now: Duration::ZERO,
                    tasks: Vec::new(),
                    running: None,
                    progress: 0,
                    eligible: EligibleSet::default(),
                    blocked_now: Vec::new(),
                    timers: BinaryHeap::new(),
                    timer_seq: 0,
                    trace: seed,
                    steps: 0,
                    handoffs: 0,
                    failure: None,
                    finished: false,
                    last_decision: Instant::now(),
                    paused: Default::default(),
                }),
                driver: Condvar::new(),
                config,
                seed,
            }),
        }
    }

    pub fn seed(&self) -> u64 {
        self.inner.seed
    }

    /// Simulated time.
    pub fn now(&self) -> Duration {
        self.inner.lock().now
    }

    /// A random number from the simulation's stream. Deterministic when called from
    /// tasks (only one runs at a time) or from the driver before `run`.
    pub fn random(&self) -> u64 {
        self.inner.lock().rng.next_u64()
    }

    /// Uniform in `0..n`.
    pub fn below(&self, n: u64) -> u64 {
        self.inner.lock().rng.below(n)
    }

    /// True with probability `p`.
    pub fn chance(&self, p: f64) -> bool {
        self.inner.lock().rng.chance(p)
    }

    /// A generator of its own, forked from the simulation's stream.
    pub fn fork_rng(&self) -> SimRng {
        self.inner.lock().rng.fork()
    }

    /// Start a task. From the driver before `run`, or from a running task (the new
    /// task belongs to the spawning task's group).
    pub fn spawn(&self, name: impl Into<String>, f: impl FnOnce() + Send + 'static) -> TaskId {
        let group = {
            let st = self.inner.lock();
            st.running.and_then(|t| st.tasks[t.0].group)
        };
        self.spawn_in(group, name, f)
    }

    /// Start a task of simulated node `group` (None: of no node): it does not run
    /// while its group is paused.
    pub fn spawn_in(
        &self,
        group: Option<u32>,
        name: impl Into<String>,
        f: impl FnOnce() + Send + 'static,
    ) -> TaskId {
        let name = name.into();
        let baton = Arc::new(Baton {
            go: Mutex::new(false),
            cv: Condvar::new(),
        });
        let id = {
            let mut st = self.inner.lock();
            let id = TaskId(st.tasks.len());
            st.tasks.push(Task {
                name: name.clone(),
                state: TaskState::Runnable,
                baton: baton.clone(),
                blocked_at: None,
                watch: None,
                group,
                kernel: false,
            });
            let eligible = st.is_eligible(id.0);
            st.eligible.set(id.0, eligible);
            st.bump_progress();
            id
        };
        let inner = self.inner.clone();
        let handle = Arc::new(TaskHandle {
            inner: inner.clone(),
            id,
        });
        let spawned = std::thread::Builder::new()
            .name(format!("sim:{name}"))
            .stack_size(inner.config.stack_bytes)
            .spawn(move || {
                CURRENT_TASK.with(|c| *c.borrow_mut() = Some((inner.clone(), id)));
                wait_for_turn(&baton);
                mako_diag::sched::install(handle.clone());
                let result = std::panic::catch_unwind(AssertUnwindSafe(f));
                mako_diag::sched::uninstall();
                let mut st = inner.lock();
                if let Err(payload) = result {
                    let msg = panic_message(&payload);
                    if st.failure.is_none() {
                        st.failure =
                            Some(format!("task '{}' panicked: {msg}", st.tasks[id.0].name));
                    }
                }
                st.set_state(id, TaskState::Done);
                st.bump_progress();
                // Hand the processor on; this thread then ends.
                inner.dispatch(st, id);
            });
        if let Err(e) = spawned {
            let mut st = self.inner.lock();
            st.set_state(id, TaskState::Done);
            st.failure
                .get_or_insert_with(|| format!("could not start a thread for task '{name}': {e}"));
        }
        id
    }

    /// Stop every task of `group` (a simulated node's process is stopped: SIGSTOP):
    /// none is chosen until `resume_group`. Its timers still fire (simulated time goes
    /// on); a task whose timer fired runs once the group resumes.
    pub fn pause_group(&self, group: u32) {
        let mut st = self.inner.lock();
        st.paused.insert(group);
        st.refresh_group(group);
    }

    /// The tasks of `group` run again.
    pub fn resume_group(&self, group: u32) {
        let mut st = self.inner.lock();
        st.paused.remove(&group);
        st.refresh_group(group);
        st.bump_progress();
    }

    pub fn is_paused(&self, group: u32) -> bool {
        self.inner.lock().paused.contains(&group)
    }

    /// Run until every task has finished (or the run fails). Call from a thread that
    /// is not a task, once.
    pub fn run(&self) -> Result<SimReport, SimFailure> {
        {
            let st = self.inner.lock();
            assert!(st.running.is_none(), "Sim::run called twice");
            self.inner.dispatch_from_driver(st);
        }
        let mut st = self.inner.lock();
        loop {
            if st.finished {
                break;
            }
            let timeout = self.inner.config.hang_timeout;
            let (g, _) = self
                .inner
                .driver
                .wait_timeout(st, Duration::from_millis(500))
                .unwrap_or_else(|e| e.into_inner());
            st = g;
            if !st.finished && st.last_decision.elapsed() > timeout {
                let who = st
                    .running
                    .map(|t| st.tasks[t.0].name.clone())
                    .unwrap_or_else(|| "(none)".into());
                st.failure.get_or_insert_with(|| {
                    format!(
                        "hang: no scheduling decision for {timeout:?} of real time; task '{who}' holds the processor \
                         (it blocked its thread outside the scheduler: a raw lock held across a scheduling point, or a real sleep)"
                    )
                });
                st.finished = true;
            }
        }
        if let Some(message) = st.failure.clone() {
            return Err(SimFailure {
                seed: self.inner.seed,
                message,
                elapsed: st.now,
            });
        }
        Ok(SimReport {
            seed: self.inner.seed,
            elapsed: st.now,
            steps: st.steps,
            trace: st.trace,
            tasks: st.tasks.len(),
            handoffs: st.handoffs,
        })
    }
}

fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".into()
    }
}

fn wait_for_turn(baton: &Baton) {
    let mut go = baton.go.lock().unwrap_or_else(|e| e.into_inner());
    while !*go {
        go = baton.cv.wait(go).unwrap_or_else(|e| e.into_inner());
    }
    *go = false;
}

fn give_turn(baton: &Baton) {
    *baton.go.lock().unwrap_or_else(|e| e.into_inner()) = true;
    baton.cv.notify_one();
}

impl State {
    /// Whether the scheduler may pick task `i` now.
    fn is_eligible(&self, i: usize) -> bool {
        let t = &self.tasks[i];
        if let (Some(g), false) = (t.group, t.kernel) {
            if !self.paused.is_empty() && self.paused.contains(&g) {
                return false;
            }
        }
        match t.state {
            TaskState::Runnable => true,
            TaskState::Blocked { since, .. } => since < self.progress,
            _ => false,
        }
    }

    /// Set a task's state, keeping the eligible set in step.
    fn set_state(&mut self, id: TaskId, state: TaskState) {
        self.tasks[id.0].state = state;
        let eligible = self.is_eligible(id.0);
        self.eligible.set(id.0, eligible);
        if matches!(state, TaskState::Blocked { .. }) && !eligible {
            self.blocked_now.push(id.0);
        }
    }

    /// A task made progress: the tasks blocked until then may re-check.
    fn bump_progress(&mut self) {
        self.progress += 1;
        for i in std::mem::take(&mut self.blocked_now) {
            let eligible = self.is_eligible(i);
            self.eligible.set(i, eligible);
        }
    }

    /// A group was paused or resumed: its tasks' eligibility follows.
    fn refresh_group(&mut self, group: u32) {
        for i in 0..self.tasks.len() {
            if self.tasks[i].group == Some(group) {
                let eligible = self.is_eligible(i);
                self.eligible.set(i, eligible);
                if matches!(self.tasks[i].state, TaskState::Blocked { .. }) && !eligible {
                    self.blocked_now.push(i);
                }
            }
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pick the next task to run, advancing simulated time if nothing can run now.
    /// None: the run is over (all done, failed, or deadlocked — recorded in `failure`).
    fn choose(&self, st: &mut State) -> Option<TaskId> {
        if st.failure.is_some() {
            return None;
        }
        st.steps += 1;
        if st.steps > self.config.steps_max {
            st.failure = Some(format!(
                "livelock: {} scheduling decisions without finishing",
                self.config.steps_max
            ));
            return None;
        }
        loop {
            debug_assert_eq!(
                st.eligible.len(),
                (0..st.tasks.len()).filter(|i| st.is_eligible(*i)).count()
            );
            let count = st.eligible.len();
            if count > 0 {
                let k = st.rng.below(count as u64) as usize;
                let pick = st.eligible.nth(k);
                st.trace = mix(st.trace, pick as u64, st.now.as_nanos() as u64);
                if let (TaskState::Blocked { on, .. }, Some(ready)) =
                    (st.tasks[pick].state, st.tasks[pick].watch)
                {
                    if !ready() {
                        // The task would look, find its condition false and block
                        // again, a new decision: do that here, without waking its
                        // thread (two thread switches). The schedule is the same.
                        let since = st.progress;
                        st.set_state(TaskId(pick), TaskState::Blocked { since, on });
                        st.steps += 1;
                        if st.steps > self.config.steps_max {
                            st.failure = Some(format!(
                                "livelock: {} scheduling decisions without finishing",
                                self.config.steps_max
                            ));
                            return None;
                        }
                        continue;
                    }
                }
                return Some(TaskId(pick));
            }
            if let Some(timer) = st.timers.pop() {
                if timer.at > st.now {
                    st.now = timer.at;
                }
                if st.tasks[timer.task.0].state == TaskState::Sleeping {
                    st.set_state(timer.task, TaskState::Runnable);
                }
                continue;
            }
            let blocked: Vec<String> = st
                .tasks
                .iter()
                .filter_map(|t| match t.state {
                    TaskState::Blocked { on, .. } => Some(match &t.blocked_at {
                        Some(trace) => format!("'{}' on {on} at\n{trace}", t.name),
                        None => format!("'{}' on {on}", t.name),
                    }),
                    _ => None,
                })
                .collect();
            if !blocked.is_empty() {
                st.failure = Some(format!(
                    "deadlock: every task is blocked and no timer is pending: {}",
                    blocked.join(", ")
                ));
            }
            return None;
        }
    }

    /// The current task (`me`) has set its own state; pass the processor to the next
    /// task and, unless `me` is done, wait until it is `me`'s turn again.
    fn dispatch(&self, mut st: MutexGuard<'_, State>, me: TaskId) {
        st.last_decision = Instant::now();
        let next = self.choose(&mut st);
        match next {
            Some(n) if n == me => {
                st.running = Some(me);
            }
            Some(n) => {
                st.running = Some(n);
                st.handoffs += 1;
                let baton = st.tasks[n.0].baton.clone();
                let mine = st.tasks[me.0].baton.clone();
                let done = st.tasks[me.0].state == TaskState::Done;
                drop(st);
                give_turn(&baton);
                if !done {
                    wait_for_turn(&mine);
                }
            }
            None => {
                st.running = None;
                st.finished = true;
                let done = st.tasks[me.0].state == TaskState::Done;
                let mine = st.tasks[me.0].baton.clone();
                drop(st);
                self.driver.notify_all();
                if !done {
                    // The run is over while this task still waits: its thread parks for
                    // good (the process ends it).
                    wait_for_turn(&mine);
                }
            }
        }
    }

    fn dispatch_from_driver(&self, mut st: MutexGuard<'_, State>) {
        st.last_decision = Instant::now();
        match self.choose(&mut st) {
            Some(n) => {
                st.running = Some(n);
                let baton = st.tasks[n.0].baton.clone();
                drop(st);
                give_turn(&baton);
            }
            None => {
                st.finished = true;
                drop(st);
                self.driver.notify_all();
            }
        }
    }
}

/// The scheduler as one task sees it (installed on the task's thread).
pub(crate) struct TaskHandle {
    pub(crate) inner: Arc<Inner>,
    pub(crate) id: TaskId,
}

impl TaskScheduler for TaskHandle {
    fn preempt(&self, _at: &'static str) {
        let mut st = self.inner.lock();
        st.bump_progress();
        let p = self.inner.config.preempt_probability;
        if !st.rng.chance(p) {
            return;
        }
        st.set_state(self.id, TaskState::Runnable);
        self.inner.dispatch(st, self.id);
    }

    fn block(&self, on: &'static str) {
        self.block_watching(on, None);
    }

    fn block_until_ready(&self, on: &'static str, ready: &(dyn Fn() -> bool + Sync)) {
        // SAFETY: the reference is kept in the task's entry only while this call is
        // blocked in `block_watching` (which clears it before it returns), and the
        // scheduler calls it only while the task is blocked there: `ready` outlives
        // every use. (A task still blocked when the run ends never returns: its thread
        // stays parked with its frame.)
        let watch: &'static (dyn Fn() -> bool + Sync) = unsafe { std::mem::transmute(ready) };
        while !ready() {
            self.block_watching(on, Some(watch));
        }
    }

    fn sleep(&self, duration: Duration) {
        let mut st = self.inner.lock();
        st.bump_progress();
        let at = st.now + duration;
        let seq = st.timer_seq;
        st.timer_seq += 1;
        st.timers.push(Timer {
            at,
            seq,
            task: self.id,
        });
        st.set_state(self.id, TaskState::Sleeping);
        self.inner.dispatch(st, self.id);
    }

    fn now(&self) -> Duration {
        self.inner.lock().now
    }
}

impl TaskHandle {
    fn block_watching(&self, on: &'static str, watch: Option<&'static (dyn Fn() -> bool + Sync)>) {
        let trace = std::env::var_os("MAKO_SIM_BLOCK_TRACE")
            .map(|_| std::backtrace::Backtrace::force_capture().to_string());
        let mut st = self.inner.lock();
        let since = st.progress;
        st.set_state(self.id, TaskState::Blocked { since, on });
        st.tasks[self.id.0].blocked_at = trace;
        st.tasks[self.id.0].watch = watch;
        self.inner.dispatch(st, self.id);
        let mut st = self.inner.lock();
        st.tasks[self.id.0].watch = None;
        if let TaskState::Blocked { .. } = st.tasks[self.id.0].state {
            st.set_state(self.id, TaskState::Runnable);
        }
    }
}

/// Run `f` (on the current task) as the operating system's work for it: an I/O
/// already submitted completes at its time even if the task's node is paused
/// meanwhile (a stopped process's disk writes still land). Once `f` returns, a paused
/// task stops until its node resumes. Outside a task, just `f()`.
pub fn kernel_section<T>(f: impl FnOnce() -> T) -> T {
    let Some((inner, me)) = CURRENT_TASK.with(|c| c.borrow().clone()) else {
        return f();
    };
    {
        let mut st = inner.lock();
        st.tasks[me.0].kernel = true;
        let eligible = st.is_eligible(me.0);
        st.eligible.set(me.0, eligible);
    }
    let out = f();
    let mut st = inner.lock();
    st.tasks[me.0].kernel = false;
    let paused = st.tasks[me.0].group.is_some_and(|g| st.paused.contains(&g));
    if paused {
        // Back in the process, which is stopped: wait for the resume.
        st.set_state(me, TaskState::Runnable);
        inner.dispatch(st, me);
    } else {
        let eligible = st.is_eligible(me.0);
        st.eligible.set(me.0, eligible);
    }
    out
}

/// The simulation the current thread runs in, if it is a simulated task.
pub fn current() -> Option<Sim> {
    CURRENT_SIM.with(|c| c.borrow().clone())
}

thread_local! {
    static CURRENT_TASK: std::cell::RefCell<Option<(Arc<Inner>, TaskId)>> = const { std::cell::RefCell::new(None) };
    static CURRENT_SIM: std::cell::RefCell<Option<Sim>> = const { std::cell::RefCell::new(None) };
}

impl Sim {
    /// As `spawn`, and the task can find its simulation with [`current`].
    pub fn spawn_task(&self, name: impl Into<String>, f: impl FnOnce() + Send + 'static) -> TaskId {
        let sim = self.clone();
        self.spawn(name, move || {
            CURRENT_SIM.with(|c| *c.borrow_mut() = Some(sim));
            f();
            CURRENT_SIM.with(|c| *c.borrow_mut() = None);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mako_diag::sched;
    use parking_lot::Mutex as PlMutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    static TEST_LOCK: mako_diag::LockClass = mako_diag::LockClass::new("sim.test");

    /// Tasks that contend on a counted lock and sleep: the result and the trace are a
    /// function of the seed only.
    fn contention_run(seed: u64) -> (SimReport, Vec<usize>) {
        let sim = Sim::new(seed, SimConfig::default());
        let order = Arc::new(PlMutex::new(Vec::new()));
        let lock = Arc::new(mako_diag::CountedMutex::new(&TEST_LOCK, 0u64));
        for t in 0..5 {
            let order = order.clone();
            let lock = lock.clone();
            sim.spawn(format!("t{t}"), move || {
                for i in 0..20 {
                    let mut g = lock.lock();
                    *g += 1;
                    // Held across a scheduling point: others must block, not hang.
                    sched::sleep(Duration::from_micros(10 + (t * 7 + i) as u64 % 13));
                    order.lock().push(t);
                    drop(g);
                    sched::preempt_point("loop");
                }
            });
        }
        let report = sim.run().expect("run");
        assert_eq!(*lock.lock(), 100);
        let order = order.lock().clone();
        (report, order)
    }

    /// The schedules of these seeds as the scheduler made them when it scanned every
    /// task at each decision: keeping the eligible tasks in an indexed set (O(log n)
    /// per decision) changed how fast a task is chosen, not which one.
    #[test]
    fn schedules_are_those_of_the_linear_scan() {
        for (seed, trace, steps, first) in [
            (
                7,
                0x902e_5b8b_e63f_a97a,
                506,
                [3, 3, 3, 0, 0, 3, 3, 2, 2, 2],
            ),
            (
                8,
                0x2ba8_2e0c_bbd0_7171,
                454,
                [4, 4, 4, 4, 4, 4, 4, 4, 4, 0],
            ),
            (
                1,
                0x88cb_3e52_b238_a6d2,
                494,
                [3, 2, 2, 2, 0, 0, 0, 0, 3, 3],
            ),
            (
                2,
                0xe8e6_1c9c_860c_9553,
                457,
                [0, 3, 3, 3, 3, 3, 2, 2, 4, 4],
            ),
        ] {
            let (r, order) = contention_run(seed);
            assert_eq!(
                (r.trace, r.steps, &order[..10]),
                (trace, steps, &first[..]),
                "seed {seed}"
            );
        }
    }

    #[test]
    fn a_seed_replays_bit_for_bit() {
        let (a, oa) = contention_run(7);
        let (b, ob) = contention_run(7);
        assert_eq!(a, b);
        assert_eq!(oa, ob);
        let (c, oc) = contention_run(8);
        assert!(
            a.trace != c.trace || oa != oc,
            "another seed, another schedule"
        );
        assert!(a.elapsed > Duration::ZERO);
    }

    /// Waiters on condition variables while others work: the schedule is the one of
    /// the scheduler that woke a waiter at every turn to let it re-check (pinned), but
    /// the waiters' threads are woken only when notified.
    #[test]
    fn waiters_sleep_through_turns_that_would_not_wake_them() {
        let sim = Sim::new(21, SimConfig::default());
        let pair = Arc::new((PlMutex::new(0u32), mako_diag::Condvar::new()));
        for w in 0..3 {
            let p = pair.clone();
            sim.spawn(format!("waiter{w}"), move || {
                let mut g = p.0.lock();
                while *g < 3 {
                    p.1.wait(&mut g);
                }
            });
        }
        for b in 0..3u64 {
            let p = pair.clone();
            sim.spawn(format!("busy{b}"), move || {
                for i in 0..300 {
                    sched::preempt_point("busy");
                    if i % 50 == 0 {
                        sched::sleep(Duration::from_micros(1 + b));
                    }
                }
                *p.0.lock() += 1;
                p.1.notify_all();
            });
        }
        let r = sim.run().expect("run");
        assert_eq!(
            (r.trace, r.steps),
            (0x58ad_026f_8c8a_1575, 509),
            "the schedule of the linear scan"
        );
        assert!(
            r.handoffs * 2 < r.steps,
            "{} handoffs in {} decisions",
            r.handoffs,
            r.steps
        );
    }

    #[test]
    fn deadlock_is_reported_with_the_blocked_tasks() {
        let sim = Sim::new(1, SimConfig::default());
        let a = Arc::new(mako_diag::CountedMutex::new(&TEST_LOCK, ()));
        let b = Arc::new(mako_diag::CountedMutex::new(&TEST_LOCK, ()));
        let (a2, b2) = (a.clone(), b.clone());
        sim.spawn("ab", move || {
            let _x = a.lock();
            sched::sleep(Duration::from_millis(1));
            let _y = b.lock();
        });
        sim.spawn("ba", move || {
            let _x = b2.lock();
            sched::sleep(Duration::from_millis(1));
            let _y = a2.lock();
        });
        let e = sim.run().expect_err("must deadlock");
        assert!(e.message.contains("deadlock"), "{e}");
        assert!(
            e.message.contains("'ab'") && e.message.contains("'ba'"),
            "{e}"
        );
    }

    #[test]
    fn a_panicking_task_fails_the_run() {
        let sim = Sim::new(3, SimConfig::default());
        sim.spawn("bad", || panic!("boom 42"));
        sim.spawn("good", || sched::sleep(Duration::from_millis(5)));
        let e = sim.run().expect_err("must fail");
        assert!(e.message.contains("boom 42"), "{e}");
    }

    #[test]
    fn condvars_and_time() {
        let sim = Sim::new(5, SimConfig::default());
        let pair = Arc::new((PlMutex::new(0u32), mako_diag::Condvar::new()));
        let woke_at = Arc::new(AtomicU64::new(0));
        let (p1, w1) = (pair.clone(), woke_at.clone());
        sim.spawn("waiter", move || {
            let mut g = p1.0.lock();
            while *g == 0 {
                p1.1.wait(&mut g);
            }
            w1.store(
                sched::current().expect("task").now().as_micros() as u64,
                Ordering::SeqCst,
            );
            // A timed wait that nobody notifies times out in simulated time.
            assert!(p1.1.wait_for(&mut g, Duration::from_millis(3)));
        });
        let p2 = pair.clone();
        sim.spawn("notifier", move || {
            sched::sleep(Duration::from_millis(2));
            *p2.0.lock() = 1;
            p2.1.notify_all();
        });
        let r = sim.run().expect("run");
        assert_eq!(woke_at.load(Ordering::SeqCst), 2000);
        assert!(r.elapsed >= Duration::from_millis(5));
    }

    #[test]
    fn tasks_spawn_tasks() {
        let sim = Sim::new(9, SimConfig::default());
        let n = Arc::new(AtomicU64::new(0));
        let n2 = n.clone();
        sim.spawn_task("parent", move || {
            let sim = current().expect("in a simulation");
            for i in 0..10 {
                let n = n2.clone();
                sim.spawn(format!("child{i}"), move || {
                    sched::sleep(Duration::from_micros(i));
                    n.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        sim.run().expect("run");
        assert_eq!(n.load(Ordering::SeqCst), 10);
    }
}
