//! One trial run as a Slurm job, from `sbatch` to its end, in the step
//! supervisor's shape (`supervisor.rs`): one task whose `select!` names its
//! events (a reading of the jobs' states, output the job wrote, the answer
//! of a command it spawned, the next step of a stop), each handled without
//! waiting on anything; the run's outcome a pure function of what it saw
//! ([`judge`]).
//!
//! Nothing in the loop waits on the controller or the disk: `scancel` runs
//! in a task of its own with a deadline and its answer comes back as an
//! event, and the job's output file is read on a blocking thread by a tail
//! task that sends what the file gained.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use super::board::Board;
use super::jobs::{JobEnd, JobState};
use super::output::{step_outcome, StepEnd, StepWatch};
use crate::backend::{ExitOutcome, StopLevel};
use crate::process::log_tail;
use crate::service::Registration;
use crate::supervise::{Escalation, StopStep};

/// The line the batch script ends with: the ranks' step's exit code.
pub(super) const STEP_EXIT: &str = "nestor: the ranks' job step exited with code ";

/// The batch script's first line on a node that does not see the trial's
/// directory, before the node's name.
pub(super) const UNSHARED: &str = "nestor: the experiment's directory is not visible on ";

/// How long a run may wait for Slurm to list a job it just accepted.
const LISTED_WITHIN: Duration = Duration::from_secs(60);

/// A pause before a run whose job Slurm would not take ends (the loop then
/// starts it again): the controller is busy, or a limit of the queue is reached.
const SUBMIT_BACKOFF: Duration = Duration::from_secs(5);

/// How long `scancel` has to answer.
const CANCEL_DEADLINE: Duration = Duration::from_secs(30);

/// How often the job's output file is read.
const TAIL_EVERY: Duration = Duration::from_millis(500);

/// One run as a Slurm job, as its supervisor holds it.
pub(super) struct JobRun {
    pub(super) trial_id: String,
    /// The job's name (`nestor-<experiment>-<trial>-<token>`).
    pub(super) name: String,
    pub(super) sbatch: tokio::process::Command,
    pub(super) script: String,
    /// The job's output file.
    pub(super) output: PathBuf,
    /// The job's output as its node sends it (`JobOutput`), when that node does not see the file.
    pub(super) relayed: mpsc::Receiver<Vec<u8>>,
    /// The experiment's directory, and whether the driver has said that jobs run where it is not.
    pub(super) unshared: Arc<(PathBuf, AtomicBool)>,
    pub(super) watch: StepWatch,
    pub(super) stopping: Escalation,
    pub(super) log_paths: Vec<PathBuf>,
    pub(super) job_log: PathBuf,
    pub(super) rendezvous: PathBuf,
    pub(super) registration: Registration,
    pub(super) board: Arc<Board>,
    pub(super) world: u32,
    /// The job was submitted to start later (`--begin` among the user's
    /// options): waiting for its begin time says nothing of a requeue.
    pub(super) begins_later: bool,
    /// What the job's output said so far.
    pub(super) said: Said,
}

/// What a job's output said of its run.
#[derive(Debug, Default)]
pub(super) struct Said {
    /// A line read in part.
    pending: String,
    /// The exit code the job's last line gave for its ranks' step.
    step_exit: Option<i32>,
    /// Slurm started the job again after a requeue.
    requeue_seen: bool,
    /// The job has written something (to its file, or through the relay): it ran.
    heard: bool,
    /// Each rank's node, as its first line says (empty until then).
    rank_nodes: Vec<String>,
}

impl Said {
    pub(super) fn new(world: u32) -> Self {
        Self { rank_nodes: vec![String::new(); world as usize], ..Self::default() }
    }
}

/// How a job left the driver's sight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Left {
    /// It ended in this state.
    Ended(JobState),
    /// Slurm put it back in its queue after it had run (and nestor cancelled it).
    Requeued(String),
    /// It is no longer listed (Slurm forgot it) without an end seen.
    Vanished,
}

/// What comes back to a job's supervisor from the tasks it started.
#[derive(Debug)]
enum Heard {
    /// What the job's output file gained.
    Output(Vec<u8>),
    /// `scancel`'s answer: `None` when it did what was asked.
    Cancelled { job: String, trouble: Option<String> },
}

/// How a run ends, as [`judge`] finds it.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// As a job step whose ranks exited with this code.
    Step(i32),
    /// So.
    Is(ExitOutcome),
}

/// A run's end, from how its job left, what its output said and what was
/// asked of it. A job Slurm requeued (seen in the queue again, or started
/// again and saying so) is the cluster's doing, as is one cancelled outside
/// nestor, preempted, out of time, or forgotten without a word; its ranks'
/// exit code is judged as a step's.
fn judge(left: Left, said: &Said, requested: StopLevel, id: &str, job_log: &Path) -> Verdict {
    let failed = |why: String| Verdict::Is(ExitOutcome::Failed(format!("job {id}: {why}")));
    let cluster = |why: String| Verdict::Is(ExitOutcome::Infrastructure(why));
    let left = match left {
        Left::Ended(_) | Left::Vanished if said.requeue_seen => Left::Requeued("it was started again".into()),
        other => other,
    };
    match left {
        Left::Requeued(why) if requested == StopLevel::Run => {
            cluster(format!("Slurm put job {id} back in its queue ({why}); the trial goes on from its latest checkpoint in a new job"))
        }
        Left::Requeued(_) => Verdict::Is(ExitOutcome::Stopped),
        Left::Ended(state) => match state.end() {
            Some(JobEnd::Done) | Some(JobEnd::Failed) => Verdict::Step(match (state == JobState::Completed, said.step_exit) {
                (true, _) => 0,
                (false, Some(c)) if c != 0 => c,
                (false, _) => 1,
            }),
            Some(JobEnd::OutOfMemory) if requested == StopLevel::Run => failed(format!(
                "out of memory: Slurm ended the job for using more memory than it asked for ({}); ask for more with the workers' `memory`",
                job_log.display()
            )),
            Some(JobEnd::Cancelled) if requested == StopLevel::Run => cluster(format!(
                "job {id} was cancelled outside nestor (scancel, an operator); the trial goes on from its latest checkpoint"
            )),
            Some(JobEnd::Infrastructure(why)) if requested == StopLevel::Run => {
                cluster(format!("{why} (job {id}); the trial goes on from its latest checkpoint"))
            }
            Some(_) => Verdict::Is(ExitOutcome::Stopped),
            None => failed(format!("ended in state {state:?}")),
        },
        Left::Vanished => match said.step_exit {
            Some(code) => Verdict::Step(code),
            None if requested > StopLevel::Run => Verdict::Is(ExitOutcome::Stopped),
            None => cluster(format!(
                "Slurm no longer lists job {id} and it left no word of how it ended; the trial goes on from its latest checkpoint"
            )),
        },
    }
}

impl JobRun {
    /// Runs the job to its end; its run's outcome.
    pub(super) async fn run(mut self) -> ExitOutcome {
        let outcome = self.follow().await;
        let _ = std::fs::remove_file(&self.rendezvous);
        let aggregator = self.registration.aggregator();
        if outcome == ExitOutcome::Completed {
            for r in 0..self.world {
                aggregator.rank_finished(r);
            }
        } else {
            aggregator.fail();
        }
        outcome
    }

    /// Submits the job and follows it to its end; the run's outcome.
    async fn follow(&mut self) -> ExitOutcome {
        let id = match self.submit().await {
            Ok(id) => id,
            Err(outcome) => return outcome,
        };
        tracing::info!(trial = %self.trial_id, job = %id, "submitted");
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.job_log)
            .and_then(|mut f| std::io::Write::write_all(&mut f, format!("nestor: job {id} ({}) submitted\n", self.name).as_bytes()));
        let (heard_tx, mut heard) = mpsc::channel::<Heard>(64);
        let (stop_tail, tail) = spawn_tail(self.output.clone(), heard_tx.clone());
        let left = self.watch_job(&id, &heard_tx, &mut heard).await;
        // What the job wrote last: the tail's, the relay's (a job's relay has sent everything before
        // its job ends), then what the file holds past the tail's last reading.
        let _ = stop_tail.send(());
        let offset = tail.await.unwrap_or(0);
        drop(heard_tx);
        while let Ok(h) = heard.try_recv() {
            self.on_heard(h);
        }
        while let Ok(bytes) = self.relayed.try_recv() {
            self.take_output(&bytes, false);
        }
        let output = self.output.clone();
        let last = tokio::task::spawn_blocking(move || read_from(&output, offset).0).await.unwrap_or_default();
        self.take_output(&last, true);
        let requested = self.stopping.asked();
        match judge(left, &self.said, requested, &id, &self.job_log) {
            Verdict::Step(code) => self.step_outcome(code, requested, &id),
            Verdict::Is(outcome) => outcome,
        }
    }

    /// The outcome of a job whose step exited with `code`, as a step inside an allocation's.
    fn step_outcome(&mut self, code: i32, requested: StopLevel, id: &str) -> ExitOutcome {
        use std::os::unix::process::ExitStatusExt;
        let status = Ok(std::process::ExitStatus::from_raw((code & 0xff) << 8));
        let rank_nodes = self.said.rank_nodes.clone();
        let failed = self.watch.failed.take();
        let end = StepEnd {
            status: &status,
            requested,
            lost: None,
            refused: self.watch.refused.take(),
            down_here: &[],
            failed,
            rank_nodes: &rank_nodes,
        };
        match step_outcome(end, &self.log_paths, &self.job_log, |log| log_tail(log, 20)) {
            ExitOutcome::Failed(why) => ExitOutcome::Failed(format!("job {id}: {why}")),
            ExitOutcome::Infrastructure(why) => ExitOutcome::Infrastructure(format!("job {id}: {why}")),
            other => other,
        }
    }

    /// `sbatch`: the job's id, or how the run ends when Slurm will not take it.
    async fn submit(&mut self) -> Result<String, ExitOutcome> {
        if self.stopping.asked() > StopLevel::Run {
            return Err(ExitOutcome::Stopped);
        }
        self.board.count_call();
        let mut child = self.sbatch.spawn().map_err(|e| ExitOutcome::Failed(format!("cannot run sbatch: {e}")))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(self.script.as_bytes()).await;
        }
        let out = child.wait_with_output().await.map_err(|e| ExitOutcome::Failed(format!("sbatch: {e}")))?;
        let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if !out.status.success() {
            let said = if said.is_empty() { format!("sbatch {}", crate::groups::describe_exit(out.status)) } else { said };
            if transient(&said) {
                tokio::time::sleep(SUBMIT_BACKOFF).await;
                return Err(ExitOutcome::Infrastructure(format!("Slurm did not take the trial's job now: {said}")));
            }
            return Err(ExitOutcome::Failed(format!("Slurm refused the trial's job: {said}")));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let id = text.trim().split(';').next().unwrap_or_default().trim().to_string();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit() || c == '_') {
            return Err(ExitOutcome::Failed(format!("sbatch gave no job id: {:?} {said}", text.trim())));
        }
        self.board.poke.notify_one();
        Ok(id)
    }

    /// Follows job `id` until it leaves: its states from the board, its
    /// output as it grows, the answers of the commands it spawned, stops as
    /// they are asked.
    async fn watch_job(&mut self, id: &str, heard_tx: &mpsc::Sender<Heard>, heard: &mut mpsc::Receiver<Heard>) -> Left {
        let mut readings = self.board.readings.subscribe();
        readings.mark_changed();
        let submitted = tokio::time::Instant::now();
        let mut seen: Option<JobState> = None;
        let mut ran = false;
        let mut warned = false;
        // The ranks had started when the cluster took them off their CPUs (suspended, or torn down: a
        // requeue, the job's end): the hang clock stops until they run again.
        let mut held = false;
        loop {
            tokio::select! {
                changed = readings.changed() => {
                    if changed.is_err() {
                        return Left::Vanished;
                    }
                    let reading = readings.borrow_and_update().clone();
                    if let Some(e) = &reading.error {
                        if !warned {
                            tracing::warn!(trial = %self.trial_id, job = %id, "reading the jobs' states: {e}; trying again");
                            warned = true;
                        }
                        continue;
                    }
                    warned = false;
                    match reading.jobs.get(id) {
                        Some(row) => {
                            let started = &self.watch.started;
                            match &row.state {
                                JobState::Completing | JobState::Suspended => held |= started.swap(false, Ordering::AcqRel),
                                JobState::Running if held => {
                                    started.store(true, Ordering::Release);
                                    held = false;
                                }
                                _ => {}
                            }
                            match &row.state {
                                JobState::Running | JobState::Completing | JobState::Suspended => ran = true,
                                // Back in the queue after it ran. It may have run between two readings: its
                                // output, or Slurm's reason (a requeued job waits for a begin time two
                                // minutes on; nestor asks for none), says so.
                                JobState::Pending | JobState::Requeued | JobState::Held
                                    if ran
                                        || self.said.requeue_seen
                                        || self.said.heard
                                        || (row.reason == "BeginTime" && !self.begins_later) =>
                                {
                                    let why = if row.reason.is_empty() { format!("{:?}", row.state) } else { row.reason.clone() };
                                    self.cancel(id, None, heard_tx);
                                    return Left::Requeued(why);
                                }
                                state => {
                                    if state.end().is_some() {
                                        return Left::Ended(state.clone());
                                    }
                                }
                            }
                            seen = Some(row.state.clone());
                        }
                        None if seen.is_some() || self.said.step_exit.is_some() => return Left::Vanished,
                        None if submitted.elapsed() > LISTED_WITHIN => return Left::Vanished,
                        None => {}
                    }
                }
                Some(h) = heard.recv() => self.on_heard(h),
                Some(bytes) = self.relayed.recv() => self.take_output(&bytes, false),
                step = self.stopping.next() => match step {
                    StopStep::Terminate if ran => self.cancel(id, Some("TERM"), heard_tx),
                    // Not running yet, or past its grace period: the job goes.
                    _ => self.cancel(id, None, heard_tx),
                },
            }
        }
    }

    /// Starts `scancel` (with `signal`: the signal to the job's steps' tasks;
    /// else the whole job) in a task of its own, with a deadline; its answer
    /// comes back as [`Heard::Cancelled`].
    fn cancel(&self, id: &str, signal: Option<&'static str>, answers: &mpsc::Sender<Heard>) {
        self.board.count_call();
        let mut c = tokio::process::Command::new("scancel");
        if let Some(s) = signal {
            c.arg(format!("--signal={s}"));
        }
        c.arg(id).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
        let (job, answers, board, trial) = (id.to_string(), answers.clone(), Arc::clone(&self.board), self.trial_id.clone());
        tokio::spawn(async move {
            let trouble = match tokio::time::timeout(CANCEL_DEADLINE, c.output()).await {
                Ok(Ok(out)) if out.status.success() => None,
                Ok(Ok(out)) => Some(String::from_utf8_lossy(&out.stderr).trim().to_string()),
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("no answer within {} s", CANCEL_DEADLINE.as_secs())),
            };
            board.poke.notify_one();
            if let Err(mpsc::error::SendError(Heard::Cancelled { trouble: Some(why), .. })) =
                answers.send(Heard::Cancelled { job: job.clone(), trouble }).await
            {
                // The run is over: said here instead.
                tracing::warn!(trial = %trial, job = %job, "scancel: {why}");
            }
        });
    }

    fn on_heard(&mut self, heard: Heard) {
        match heard {
            Heard::Output(bytes) => self.take_output(&bytes, false),
            Heard::Cancelled { job, trouble: Some(why) } => tracing::warn!(trial = %self.trial_id, job = %job, "scancel: {why}"),
            Heard::Cancelled { trouble: None, .. } => {}
        }
    }

    /// Handles what the job wrote next: its whole lines; `all`: a last
    /// line without its newline too.
    fn take_output(&mut self, bytes: &[u8], all: bool) {
        self.said.heard |= !bytes.is_empty();
        self.said.pending.push_str(&String::from_utf8_lossy(bytes));
        while let Some(at) = self.said.pending.find('\n') {
            let line: String = self.said.pending.drain(..=at).collect();
            self.on_line(line.trim_end_matches(['\n', '\r']));
        }
        if all && !self.said.pending.is_empty() {
            let line = std::mem::take(&mut self.said.pending);
            self.on_line(&line);
        }
    }

    fn on_line(&mut self, line: &str) {
        if let Some(code) = line.strip_prefix(STEP_EXIT) {
            self.said.step_exit = code.trim().parse().ok();
        }
        if line.contains("was put back in the queue; this run ends") {
            self.said.requeue_seen = true;
        }
        if let Some(node) = line.strip_prefix(UNSHARED).and_then(|rest| rest.split(':').next()) {
            let (exp_dir, noted) = &*self.unshared;
            if !noted.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "nestor: {} is not visible on {node} (trial {}): jobs' output comes to the driver, and their ranks ship checkpoints through it",
                    exp_dir.display(),
                    self.trial_id
                );
            }
        }
        // `  r: nestor: rank r of W on NODE (...)`: the prologue's first line says where rank r runs.
        if let Some((r, text)) = super::output::labelled(line) {
            if let Some(node) = text.strip_prefix(&format!("nestor: rank {r} of ")).and_then(|t| t.split(" on ").nth(1)) {
                if let (Some(slot), Some(name)) = (self.said.rank_nodes.get_mut(r as usize), node.split_whitespace().next()) {
                    *slot = name.to_string();
                }
            }
        }
        self.watch.on_line(line);
    }
}

/// Reads what `path` holds past `offset`, on a blocking thread every
/// [`TAIL_EVERY`], and sends it as [`Heard::Output`] until told to stop;
/// then answers the offset it read up to.
fn spawn_tail(path: PathBuf, out: mpsc::Sender<Heard>) -> (oneshot::Sender<()>, tokio::task::JoinHandle<u64>) {
    let (stop, mut stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut offset = 0u64;
        let mut every = tokio::time::interval(TAIL_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stopped => return offset,
                _ = every.tick() => {
                    let p = path.clone();
                    let Ok((bytes, end)) = tokio::task::spawn_blocking(move || read_from(&p, offset)).await else { return offset };
                    offset = end;
                    if !bytes.is_empty() && out.send(Heard::Output(bytes)).await.is_err() {
                        return offset;
                    }
                }
            }
        }
    });
    (stop, task)
}

/// What `path` holds past `offset`, and the offset after it (`offset`
/// itself where it cannot be read).
fn read_from(path: &Path, offset: u64) -> (Vec<u8>, u64) {
    let Ok(mut f) = std::fs::File::open(path) else { return (Vec::new(), offset) };
    if f.seek(SeekFrom::Start(offset)).is_err() {
        return (Vec::new(), offset);
    }
    let mut bytes = Vec::new();
    let n = f.read_to_end(&mut bytes).unwrap_or(0);
    bytes.truncate(n);
    (bytes, offset + n as u64)
}

/// Whether sbatch's refusal may pass (a busy controller, a limit of the queue).
fn transient(said: &str) -> bool {
    let s = said.to_ascii_lowercase();
    ["temporarily", "timed out", "unable to contact", "try again", "maxsubmit", "submit limit", "slurm_persist", "connection refused"]
        .iter()
        .any(|w| s.contains(w))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::io::Write;

    #[test]
    fn a_refusal_that_may_pass_is_told_from_one_that_will_not() {
        assert!(transient("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"));
        assert!(transient("sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying"));
        assert!(transient("sbatch: error: QOSMaxSubmitJobPerUserLimit"));
        assert!(!transient("sbatch: error: Batch job submission failed: Invalid partition name specified"));
        assert!(!transient("sbatch: error: Batch job submission failed: Requested node configuration is not available"));
    }

    fn said(step_exit: Option<i32>, requeue_seen: bool) -> Said {
        Said { step_exit, requeue_seen, ..Said::new(2) }
    }

    #[test]
    fn a_jobs_end_is_judged_from_how_it_left_and_what_it_said() {
        let log = Path::new("/x/job.log");
        let judge = |left: Left, said: &Said, requested: StopLevel| judge(left, said, requested, "7", log);
        let cluster = |v: Verdict| matches!(v, Verdict::Is(ExitOutcome::Infrastructure(_)));
        // Its ranks' exit code, judged as a step's: 0 when Slurm says it completed.
        assert_eq!(judge(Left::Ended(JobState::Completed), &said(Some(3), false), StopLevel::Run), Verdict::Step(0));
        assert_eq!(judge(Left::Ended(JobState::Failed), &said(Some(3), false), StopLevel::Run), Verdict::Step(3));
        assert_eq!(judge(Left::Ended(JobState::Failed), &said(None, false), StopLevel::Run), Verdict::Step(1));
        // The cluster's doing, not the trial's: a requeue (seen in the queue, or said by the job started
        // again, whatever it ended in), a cancel from outside, a job Slurm forgot without a word.
        assert!(cluster(judge(Left::Requeued("BeginTime".into()), &said(None, false), StopLevel::Run)));
        assert!(cluster(judge(Left::Ended(JobState::Completed), &said(Some(0), true), StopLevel::Run)));
        assert!(cluster(judge(Left::Vanished, &said(None, true), StopLevel::Run)));
        assert!(cluster(judge(Left::Ended(JobState::Cancelled), &said(None, false), StopLevel::Run)));
        assert!(cluster(judge(Left::Vanished, &said(None, false), StopLevel::Run)));
        // Forgotten after its last line: that line's code.
        assert_eq!(judge(Left::Vanished, &said(Some(2), false), StopLevel::Run), Verdict::Step(2));
        // Asked to stop: stopped, however it went.
        for left in [Left::Requeued("x".into()), Left::Ended(JobState::Cancelled), Left::Vanished] {
            assert_eq!(judge(left, &said(None, false), StopLevel::Graceful), Verdict::Is(ExitOutcome::Stopped));
        }
        match judge(Left::Ended(JobState::OutOfMemory), &said(None, false), StopLevel::Run) {
            Verdict::Is(ExitOutcome::Failed(why)) => assert!(why.contains("out of memory") && why.contains("/x/job.log"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn the_tail_sends_what_the_file_gains_and_answers_where_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.out");
        std::fs::write(&path, b"one\n").unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let (stop, task) = spawn_tail(path.clone(), tx);
        let Some(Heard::Output(first)) = rx.recv().await else { panic!("no output") };
        assert_eq!(first, b"one\n");
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"two").unwrap();
        let Some(Heard::Output(second)) = rx.recv().await else { panic!("no output") };
        assert_eq!(second, b"two");
        stop.send(()).unwrap();
        assert_eq!(task.await.unwrap(), 7);
        assert_eq!(read_from(&path, 7), (Vec::new(), 7));
        assert_eq!(read_from(&dir.path().join("none"), 3), (Vec::new(), 3));
    }
}
