//! The seam between the experiment loop and whatever runs a trial.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use crate::ack::{Ack, Acknowledged, Watermark};
use crate::resources::WorkerBundle;
use crate::storage::Storage;

/// The driver's answer to a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Directive {
    /// Keep training.
    Continue,
    /// Stop training and exit cleanly.
    Stop,
}

/// Everything needed to start one run of a trial.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The trial's id.
    pub trial_id: String,
    /// The config to train with (a JSON object).
    pub config: Value,
    /// `<experiment>/trials/<id>`: logs and checkpoints go below it.
    pub trial_dir: PathBuf,
    /// The checkpoint to resume from (`.../checkpoint_NNNNNN`, holding a
    /// `rank-<r>/` shard per rank), if any.
    pub checkpoint: Option<PathBuf>,
    /// That checkpoint's URI where it lies in the trial's object store:
    /// ranks that reach the store read their shards from it directly.
    pub checkpoint_uri: Option<String>,
    /// Iterations already done (the resumed checkpoint's iteration); the first
    /// report of this run is iteration `start_iteration + 1`.
    pub start_iteration: u64,
    /// How often, in iterations, the trainable should save a checkpoint
    /// (`[checkpoint] frequency`; 0: it decides itself).
    pub checkpoint_frequency: u64,
    /// One bundle per worker, in rank order: the run's world size is its
    /// length (at least one worker runs).
    pub workers: Vec<WorkerBundle>,
    /// Where this trial's checkpoints go (default: `trial_dir`).
    pub storage: Storage,
    /// Directories workers may checkpoint from besides the trial directory,
    /// the temporary directory and the working directory.
    pub checkpoint_roots: Vec<PathBuf>,
    /// The experiment's data sets' plan (`datasets.json`), if it has any:
    /// ranks read their shares with nestor-data's `dataset_shard`.
    pub datasets: Option<PathBuf>,
    /// Whether a report waits for the loop's decision on it. False when
    /// the loop can decide nothing on a result but to go on (no scheduler
    /// that decides on results, no stopper): in-process ranks then go on
    /// from a report once it is taken, and a stop reaches them as a stop
    /// request (their next report returns `Stopped`). Only where the
    /// backend says so ([`Backend::goes_on_unanswered`]); elsewhere ranks
    /// wait either way.
    pub await_decisions: bool,
}

impl LaunchSpec {
    /// A fresh run of `trial_id` with one single-CPU worker.
    pub fn new(trial_id: impl Into<String>, config: Value, trial_dir: impl Into<PathBuf>) -> Self {
        let trial_dir = trial_dir.into();
        Self {
            trial_id: trial_id.into(),
            config,
            storage: Storage::local(&trial_dir),
            trial_dir,
            checkpoint: None,
            checkpoint_uri: None,
            start_iteration: 0,
            checkpoint_frequency: 0,
            workers: vec![WorkerBundle::cpus(1.0)],
            checkpoint_roots: Vec::new(),
            datasets: None,
            await_decisions: true,
        }
    }

    /// The directories rank workers may checkpoint from (`working_dir`: the
    /// workers' working directory, the driver's when `None`).
    pub(crate) fn roots(&self, working_dir: Option<&std::path::Path>) -> Vec<PathBuf> {
        crate::checkpoint::roots(&self.trial_dir, working_dir, &self.checkpoint_roots)
    }

    /// The number of workers (ranks).
    pub fn world_size(&self) -> u32 {
        self.workers.len().max(1) as u32
    }

    /// Rank `rank`'s bundle.
    pub(crate) fn bundle(&self, rank: u32) -> WorkerBundle {
        self.workers.get(rank as usize).cloned().unwrap_or_else(|| WorkerBundle::cpus(1.0))
    }
}

/// Where the driver's decision on a report goes: every rank waiting on that
/// step. Dropping it unanswered tells them to stop.
#[derive(Debug)]
pub struct Reply {
    waiters: Vec<oneshot::Sender<Directive>>,
    ack: Ack,
}

impl Reply {
    pub(crate) fn new(waiters: Vec<oneshot::Sender<Directive>>, ack: Ack) -> Self {
        Self { waiters, ack }
    }

    /// A reply and the one receiver waiting on it; nobody watches its
    /// acknowledgement.
    pub fn channel() -> (Self, oneshot::Receiver<Directive>) {
        let (tx, rx) = oneshot::channel();
        (Self { waiters: vec![tx], ack: Ack::unwatched() }, rx)
    }

    /// A reply to step `iteration` of a run of its own, the one receiver
    /// waiting on it, and what watches its acknowledgement.
    pub fn watched(iteration: u64) -> (Self, oneshot::Receiver<Directive>, Acknowledged) {
        let (tx, rx) = oneshot::channel();
        let mark = Watermark::new(iteration.saturating_sub(1));
        let watch = mark.watch();
        (Self { waiters: vec![tx], ack: mark.owe(iteration) }, rx, watch)
    }

    /// Answers every waiting rank with the decision on the step, and returns
    /// what they are owed once its result is durable.
    pub fn send(self, directive: Directive) -> Ack {
        for w in self.waiters {
            // A rank that has gone away needs no answer.
            let _ = w.send(directive);
        }
        self.ack
    }
}

/// One step of a trial, once every rank has reported it and every rank's
/// checkpoint shard (if any) has been persisted under the trial directory.
#[derive(Debug, Clone)]
pub struct Report {
    /// The rank whose metrics these are (rank 0, unless it has already ended).
    pub rank: u32,
    /// 1-based iteration, assigned by the trainer.
    pub training_iteration: u64,
    /// The metrics (rank 0's: they are the trial's).
    pub metrics: BTreeMap<String, f64>,
    /// The same rank's values that are not numbers (a JSON object), if any.
    pub extra: Option<serde_json::Value>,
    /// The step's checkpoint, when any rank reported one; every shard is
    /// persisted in storage, and the checkpoint is committed once this
    /// report is stored.
    pub checkpoint: Option<CheckpointRef>,
    /// Every rank's metrics of this step, by rank, when the run has several
    /// ranks (empty with one; a rank that had ended has none). What Ray
    /// Train's `UserCallback.after_report` is given.
    pub rank_metrics: Vec<BTreeMap<String, f64>>,
}

/// A checkpoint whose shards are all persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRef {
    /// Its location: `<storage>/.../checkpoint_NNNNNN` (a local path or a URL).
    pub uri: String,
    /// The ranks that saved a shard (`rank-<r>/`), ascending.
    pub ranks: Vec<u32>,
    /// The world size of the run that saved it.
    pub world_size: u32,
}

/// How a trial's run ended, once every one of its processes or threads is gone.
#[derive(Debug, Clone, PartialEq)]
pub enum ExitOutcome {
    /// The training code returned (or was told to stop and did).
    Completed,
    /// The run was stopped from outside (a stop request, a signal).
    Stopped,
    /// The run failed; the message says why (with the failing rank's log tail).
    Failed(String),
    /// The run ended for a cause outside its code: a node it ran on was
    /// lost, or the cluster killed its step or would not start it. The
    /// message says what and where. Restarted without counting against
    /// `max_failures` (against `max_infrastructure_failures` instead).
    Infrastructure(String),
}

/// What a running trial tells the driver.
#[derive(Debug)]
pub enum EventKind {
    /// A step reported by every rank; the ranks wait for `reply`.
    Report {
        /// The report.
        report: Report,
        /// Where the driver's decision goes.
        reply: Reply,
    },
    /// A node is gone, or fails every run placed on it: no run should be
    /// placed on it again. Sent before the exit of the run that found it.
    NodeLost {
        /// The node's name.
        node: String,
        /// Why it is set aside.
        why: String,
    },
    /// The run (one worker) starts a training run of its own and books
    /// that run's resources in place of its own bundle (gRPC `Book`).
    Book {
        /// The run's whole request.
        request: crate::resources::Request,
        /// The bundles granted, once they are; why not, when they never
        /// will be. Dropped unanswered when the trial ends first.
        reply: oneshot::Sender<Result<Vec<WorkerBundle>, String>>,
    },
    /// The run (one worker) asks the driver to run the trainer it booked
    /// (gRPC `RunTrainer`), checked and prepared; what becomes of it goes
    /// to `updates`, which the driver drops once the trainer's run is over.
    RunTrainer {
        /// The run, ready to launch.
        run: Box<crate::inner::PreparedRun>,
        /// Its results, restarts and end, for the trial's process.
        updates: mpsc::UnboundedSender<crate::inner::TrainerUpdate>,
    },
    /// The run's bundles stay held after its exit, for the rest of the
    /// sweep: its job step had a rank on a node that was lost, and the
    /// cluster cannot end it (Slurm keeps what it holds on the live nodes
    /// until the job ends). Sent before the exit.
    Stuck,
    /// The run has ended and holds no resources any more (but what a
    /// `Stuck` run was given).
    Exited(ExitOutcome),
}

/// An event from one trial.
#[derive(Debug)]
pub struct Event {
    /// The trial it concerns.
    pub trial_id: String,
    /// What happened.
    pub kind: EventKind,
}

/// A run's step progress, as its aggregator knows it: which ranks the
/// next step waits for (named when a run hangs).
pub(crate) trait StepProgress: Send + Sync + std::fmt::Debug {
    /// The running ranks that have reported the fewest steps, when not all
    /// are level.
    fn lagging_ranks(&self) -> Vec<u32>;
}

/// How hard to stop a trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StopLevel {
    /// Keep running.
    Run,
    /// Finish gracefully: SIGTERM to processes; a function's next report
    /// returns [`crate::ReportError::Stopped`].
    Graceful,
    /// SIGKILL to every process of the trial.
    Kill,
}

/// The driver's handle on a launched trial.
#[derive(Debug)]
pub struct TrialHandle {
    stop: watch::Sender<StopLevel>,
    /// Process groups to signal at once on [`StopLevel::Kill`].
    groups: Vec<i32>,
    /// The signal that kills them (SIGKILL; SIGTERM for `srun`, which then
    /// ends its job step on every node).
    kill_signal: i32,
    /// The run's step progress: which ranks a step waits for.
    steps: Option<Arc<dyn StepProgress>>,
    /// Set once every rank runs (`None`: from the launch on). A run whose
    /// ranks wait for the cluster to start them is not hung.
    started: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl TrialHandle {
    /// A handle with no processes behind it, for a backend of another kind
    /// (a simulation): it watches the level `stop` asks for.
    pub fn detached() -> (Self, watch::Receiver<StopLevel>) {
        Self::new(Vec::new(), None)
    }

    pub(crate) fn new(groups: Vec<i32>, steps: Option<Arc<dyn StepProgress>>) -> (Self, watch::Receiver<StopLevel>) {
        let (tx, rx) = watch::channel(StopLevel::Run);
        (Self { stop: tx, groups, steps, kill_signal: libc::SIGKILL, started: None }, rx)
    }

    /// [`TrialHandle::new`] whose ranks run once `started` is set.
    pub(crate) fn started_by(mut self, started: Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.started = Some(started);
        self
    }

    /// Whether every rank of the run has started (a job step may wait for
    /// the cluster's resources first: that time is not a hang).
    pub fn started(&self) -> bool {
        self.started.as_ref().is_none_or(|s| s.load(std::sync::atomic::Ordering::Acquire))
    }

    /// [`TrialHandle::new`] whose `Kill` sends `signal` to the groups.
    pub(crate) fn killing_with(mut self, signal: i32) -> Self {
        self.kill_signal = signal;
        self
    }

    /// The ranks the run is waiting for: those that have reported the fewest
    /// steps among the ranks still running (empty when all are level).
    pub fn lagging_ranks(&self) -> Vec<u32> {
        self.steps.as_ref().map(|a| a.lagging_ranks()).unwrap_or_default()
    }

    /// Asks the trial to stop at `level` (never lowers an earlier request).
    /// An [`EventKind::Exited`] follows once it is gone. `Kill` signals the
    /// trial's process groups before returning, so even a driver that exits
    /// right after leaves no process behind.
    pub fn stop(&self, level: StopLevel) {
        // The level first: a supervisor that sees a rank die of this kill
        // finds it asked for, and reports a stop, not a failure.
        self.stop.send_if_modified(|cur| {
            if level > *cur {
                *cur = level;
                true
            } else {
                false
            }
        });
        if level == StopLevel::Kill {
            for &pgid in &self.groups {
                // SAFETY: killpg only sends a signal; a gone group yields ESRCH.
                unsafe {
                    libc::killpg(pgid, self.kill_signal);
                }
            }
        }
    }
}

/// Errors starting a trial.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A worker process could not be started.
    #[error("failed to start `{program}`: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The trial directory or its log files could not be created.
    #[error("failed to prepare {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The backend refused the trial (a simulation without its curve).
    #[error("{0}")]
    Refused(String),
}

/// Starts trials. Implementations: [`crate::FunctionBackend`] (a Rust closure on
/// a thread) and [`crate::ProcessBackend`] (an external command).
pub trait Backend: Send + Sync {
    /// Starts one run of a trial. Its reports and its exit arrive on `events`.
    /// Exactly one [`EventKind::Exited`] follows, once nothing of the run
    /// is left, whatever happens to the task that watches it.
    fn launch(&self, spec: LaunchSpec, events: mpsc::UnboundedSender<Event>) -> Result<TrialHandle, LaunchError>;

    /// Whether this backend's ranks read a checkpoint in the trial's object
    /// store themselves ([`LaunchSpec::checkpoint_uri`]): the driver then
    /// downloads nothing before a restore. Default: no (the driver makes a
    /// local copy and names it in [`LaunchSpec::checkpoint`]).
    fn restores_from_store(&self) -> bool {
        false
    }

    /// Whether this backend's ranks go on from a report without waiting
    /// for the decision on it when [`LaunchSpec::await_decisions`] says
    /// none is needed; a stop then reaches them through
    /// [`TrialHandle::stop`] at [`StopLevel::Graceful`], which must not
    /// cut short a rank that is merely working. Default: no (ranks always
    /// wait, and a graceful stop signals processes).
    fn goes_on_unanswered(&self) -> bool {
        false
    }

    /// Starts a run inside a running trial: a trainer its function started
    /// (Ray Train V2's Tune pattern), its ranks running `program` on the
    /// bundles the trial booked, its events on `events` as a trial's.
    /// Default: refused (an engine whose ranks are not this machine's processes).
    fn launch_inner(
        &self,
        spec: LaunchSpec,
        program: &crate::ProcessConfig,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<TrialHandle, LaunchError> {
        let _ = (spec, program, events);
        Err(LaunchError::Refused("this engine cannot run a trainer inside a trial".into()))
    }
}
