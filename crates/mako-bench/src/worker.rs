//! Multi-process phases without MPI: the coordinator re-executes its own binary with
//! [`WORKER_ARG`] and talks to each worker over stdin/stdout, one JSON line at a time.
//!
//! Protocol per phase (coordinator → worker, worker → coordinator):
//! 1. → `ProcJob` (the tasks this process runs, one thread each)
//! 2. ← `Ready` once every thread is set up, or `SetupFailed(reason)`
//! 3. → `go` or `abort` (sent only to workers that said `Ready`)
//! 4. ← `Done(results)` after a `go`
//!
//! A worker serves phases until its stdin closes, so a `bench` run keeps one pool of
//! processes for all phases. Workers write nothing else to stdout.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::task::{run_tasks, Task, TaskResult};

/// First argument that turns the binary into a benchmark worker.
pub const WORKER_ARG: &str = "__mako-bench-worker";

/// Environment variable naming the executable to spawn as a worker; used when the
/// current executable cannot act as one (for example a test harness).
pub const WORKER_EXE_ENV: &str = "MAKO_BENCH_WORKER_EXE";

/// The tasks one worker process runs in one phase.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcJob {
    pub tasks: Vec<Task>,
}

#[derive(Debug, Serialize, Deserialize)]
enum WorkerMessage {
    Ready,
    SetupFailed(String),
    Done(Vec<TaskResult>),
}

/// Runs the worker loop if `argv[1]` is [`WORKER_ARG`]; returns its exit code.
pub fn maybe_run_worker() -> Option<i32> {
    let mut args = std::env::args_os();
    let _program = args.next();
    if args.next()?.to_str() != Some(WORKER_ARG) {
        return None;
    }
    Some(match serve() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("mako-bench worker {}: {e:#}", std::process::id());
            1
        }
    })
}

fn serve() -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut output = BufWriter::new(std::io::stdout().lock());
    let mut line = String::new();
    loop {
        line.clear();
        if input.read_line(&mut line)? == 0 {
            return Ok(()); // The coordinator closed the pipe: no more phases.
        }
        let job: ProcJob = serde_json::from_str(line.trim_end())
            .context("cannot decode the job sent by the coordinator (mixed mako versions?)")?;
        let mut gate_error = None;
        let results = run_tasks(job.tasks, &mut |setup| {
            let message = match setup {
                Ok(()) => WorkerMessage::Ready,
                Err(e) => WorkerMessage::SetupFailed(e),
            };
            let ready = matches!(message, WorkerMessage::Ready);
            if let Err(e) = send(&mut output, &message) {
                gate_error = Some(e);
                return false;
            }
            if !ready {
                return false;
            }
            let mut reply = String::new();
            match input.read_line(&mut reply) {
                Ok(_) => reply.trim_end() == "go",
                Err(e) => {
                    gate_error = Some(e.into());
                    false
                }
            }
        });
        if let Some(e) = gate_error {
            return Err(e);
        }
        if let Some(results) = results {
            send(&mut output, &WorkerMessage::Done(results))?;
        }
    }
}

fn send(output: &mut impl Write, message: &WorkerMessage) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *output, message)?;
    output.write_all(b"\n")?;
    output.flush()?;
    Ok(())
}

struct WorkerProcess {
    child: Child,
    input: Option<BufWriter<ChildStdin>>,
    output: BufReader<ChildStdout>,
}

/// A set of worker processes that run phases together.
pub struct WorkerPool {
    workers: Vec<WorkerProcess>,
}

/// The executable to spawn: explicit, then [`WORKER_EXE_ENV`], then ourselves.
pub fn worker_executable(explicit: Option<&PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path.clone());
    }
    if let Some(path) = std::env::var_os(WORKER_EXE_ENV) {
        return Ok(PathBuf::from(path));
    }
    std::env::current_exe().context("cannot find our own executable to start worker processes")
}

impl WorkerPool {
    pub fn start(count: usize, executable: &PathBuf) -> anyhow::Result<WorkerPool> {
        let mut workers = Vec::with_capacity(count);
        for index in 0..count {
            let mut child = Command::new(executable)
                .arg(WORKER_ARG)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .with_context(|| {
                    format!(
                        "cannot start worker process {index} ({} {WORKER_ARG})",
                        executable.display()
                    )
                })?;
            let input = child.stdin.take().map(BufWriter::new);
            let output = child
                .stdout
                .take()
                .map(BufReader::new)
                .ok_or_else(|| anyhow!("worker {index} has no stdout pipe"))?;
            workers.push(WorkerProcess {
                child,
                input,
                output,
            });
        }
        Ok(WorkerPool { workers })
    }

    /// Runs one phase: `jobs[i]` on worker `i`. Returns each worker's task results.
    pub fn run(&mut self, jobs: Vec<ProcJob>) -> anyhow::Result<Vec<Vec<TaskResult>>> {
        if jobs.len() != self.workers.len() {
            bail!(
                "internal error: {} jobs for {} workers",
                jobs.len(),
                self.workers.len()
            );
        }
        for (index, (worker, job)) in self.workers.iter_mut().zip(&jobs).enumerate() {
            let input = worker
                .input
                .as_mut()
                .ok_or_else(|| anyhow!("worker {index} is closed"))?;
            serde_json::to_writer(&mut *input, job)?;
            input.write_all(b"\n")?;
            input.flush().with_context(|| lost(index))?;
        }
        // Collect every answer before deciding, so no worker is left waiting for a word.
        let mut ready = Vec::with_capacity(self.workers.len());
        let mut first_failure = None;
        for index in 0..self.workers.len() {
            match self.receive(index)? {
                WorkerMessage::Ready => ready.push(index),
                WorkerMessage::SetupFailed(reason) => {
                    first_failure.get_or_insert(format!("process {index}: {reason}"));
                }
                WorkerMessage::Done(_) => bail!("worker {index} answered out of turn"),
            }
        }
        let word: &[u8] = if first_failure.is_none() {
            b"go\n"
        } else {
            b"abort\n"
        };
        for &index in &ready {
            let input = self.workers[index]
                .input
                .as_mut()
                .ok_or_else(|| anyhow!("worker {index} is closed"))?;
            input.write_all(word)?;
            input.flush().with_context(|| lost(index))?;
        }
        if let Some(reason) = first_failure {
            bail!("{reason}");
        }
        let mut all = Vec::with_capacity(self.workers.len());
        for index in 0..self.workers.len() {
            match self.receive(index)? {
                WorkerMessage::Done(results) => all.push(results),
                _ => bail!("worker {index} answered out of turn"),
            }
        }
        Ok(all)
    }

    fn receive(&mut self, index: usize) -> anyhow::Result<WorkerMessage> {
        let mut line = String::new();
        let read = self.workers[index]
            .output
            .read_line(&mut line)
            .with_context(|| lost(index))?;
        if read == 0 {
            let status = self.workers[index].child.try_wait().ok().flatten();
            bail!(
                "worker process {index} exited unexpectedly ({}); see its message above",
                status.map_or("still running".to_string(), |s| s.to_string())
            );
        }
        serde_json::from_str(line.trim_end())
            .with_context(|| format!("worker {index} sent something unreadable: {line:?}"))
    }
}

fn lost(index: usize) -> String {
    format!("lost contact with worker process {index}")
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        // Closing stdin asks each worker to exit; give them a moment, then kill
        // stragglers (only our own children, by handle).
        for worker in &mut self.workers {
            worker.input = None;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for worker in &mut self.workers {
            loop {
                match worker.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        let _ = worker.child.kill();
                        let _ = worker.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }
    }
}
