//! The experiment loop, in the shape of a dispatcher: [`Runner::run`] only
//! turns its inputs (trial events, finished restores, finished flushes,
//! timers, signals) into one [`LoopEvent`] at a time; [`Runner::handle`]
//! acts on it, and [`Runner::advance`] admits trials, starts the next group
//! commit and decides whether the sweep is over. Both are synchronous, so
//! a unit test drives the loop with a scripted stream of events.
//!
//! The loop owns all mutable experiment state. It stores every result
//! before the scheduler sees it and answers the workers with the decision
//! at once; a group commit off the loop then makes the result durable,
//! and only then is it acknowledged, its checkpoint committed, its trial's
//! end shown or a run restarted from it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::{Id as TaskId, JoinError, JoinSet};

use schedulers::{Capacity, Decision, Paused as _, Scheduler, Stopper, TrialStatus, TrialView};
use search::{Metrics, Searcher, Suggestion, TrialResult};
use trainer::{
    Allocation, Backend, Directive, Event, EventKind, ExitOutcome, LaunchSpec, Report, Request, ResourcePool, StopLevel, Storage,
    TrialHandle,
};

use crate::callback::{Event as Out, StopReason};
use crate::config::{CheckpointConfig, FailureConfig};
use crate::journal::Journaled;
use crate::store::{CheckpointRecord, Store, StoreError, TrialRecord, RECORD_VERSION};
use crate::TuneError;

mod booking;
mod checkpoints;
mod commits;
mod exploits;
mod failures;
mod inner;
pub(crate) mod keep;
mod pausing;
mod reporter;
#[cfg(test)]
mod tests;

pub(crate) use crate::text::checkpoint_name;
pub(crate) use checkpoints::remove_uncommitted;

pub(crate) use crate::clock::{Clock, WallClock};
use checkpoints::Checkpoints;
pub(crate) use commits::Durability;
use failures::Cause;
pub(crate) use reporter::{experiment_info, FilesForPeople, Reporter};

use commits::{Batch, Commits, Stored};
use reporter::Output;

/// Longest a trial's end waits for a flush when no worker is waiting for one.
const END_FLUSH_DELAY: Duration = Duration::from_millis(20);

/// How often hangs are looked for and the display refreshed.
const TICK: Duration = Duration::from_millis(500);

/// The trial id of the trial with creation index `index`.
pub(crate) fn trial_id(index: u64) -> String {
    format!("trial_{index:05}")
}

/// One input of the loop.
#[derive(Debug)]
pub(crate) enum LoopEvent {
    /// SIGINT or SIGTERM: the first stops the trials gracefully, the second kills them.
    Interrupt,
    /// The wall-clock time budget is spent.
    BudgetSpent,
    /// A trial's preparation off the loop ended (or panicked: an error on that trial).
    Restored(Result<(TaskId, Box<Restored>), JoinError>),
    /// A group commit off the loop ended.
    Flushed { batch: u64, result: Result<(), StoreError> },
    /// Trial ends have waited [`END_FLUSH_DELAY`] for a flush: they get their own.
    EndsDue,
    /// Events from running trials, in the order they came.
    Trials(Vec<Event>),
    /// The periodic tick: hangs, the display, `status.json`.
    Tick,
}

/// What the dispatcher does after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// Go on.
    Go,
    /// Ctrl-C twice: the trials are killed; leave at once.
    Kill,
}

/// How the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// Every trial ran (or the budget, fail_fast or a stopper ended the sweep).
    Done,
    /// Ctrl-C.
    Interrupted,
}

/// The loop's settings, fixed for the sweep.
pub(crate) struct Settings {
    pub exp_dir: PathBuf,
    /// Every rank's metrics are kept with each result (`[python] rank_metrics`).
    pub rank_metrics: bool,
    /// The experiment's metric; every result must carry it.
    pub metric: Option<String>,
    pub max_concurrent: usize,
    pub max_trials: u64,
    pub time_budget: Option<Duration>,
    pub fail_fast: bool,
    /// What each trial asks for.
    pub request: Request,
    /// Which checkpoints to keep; where workers may save them.
    pub checkpoint: CheckpointConfig,
    /// Restarts after failures; hang detection.
    pub failure: FailureConfig,
    /// The `[stop]` thresholds alone: an exploit never restarts a trial
    /// from a checkpoint that already meets them.
    pub stop_thresholds: schedulers::MetricThresholds,
    /// When results are made durable. A replay (`AtEnd`) also writes no
    /// files for people and no checkpoint markers: its checkpoints are names only.
    pub durability: Durability,
    /// `[trainer] num_workers_from`: the config path that gives each new trial its number of workers.
    pub workers_from: Option<String>,
    /// The data sets' plan file every run's ranks read (`[datasets]`).
    pub datasets: Option<PathBuf>,
}

/// Everything a sweep's loop is built from.
pub(crate) struct Parts {
    pub settings: Settings,
    pub store: Store,
    /// `Tuner::keep_best`: the finished trials kept in the store.
    pub keep: Option<keep::Keep>,
    pub backend: Arc<dyn Backend>,
    pub clock: Arc<dyn Clock>,
    pub searcher: Box<dyn Searcher>,
    /// The scheduler, each of its hook calls journaled.
    pub scheduler: Journaled,
    pub stopper: Box<dyn Stopper>,
    /// The node's resources; a trial starts only with all its bundles.
    pub pool: ResourcePool,
    /// The experiment's checkpoint storage: `<storage>/<name>`.
    pub storage: Storage,
    /// Trials to (re)start before asking the searcher, oldest first.
    pub pending: VecDeque<TrialRecord>,
    /// PAUSED trials, oldest first.
    pub paused: Vec<TrialRecord>,
    /// Index of the next trial to create.
    pub next_index: u64,
    pub reporter: Reporter,
    /// The store holds writes of the sweep's opening not yet durable.
    pub unflushed: bool,
}

/// A running trial.
pub(crate) struct Running {
    record: TrialRecord,
    handle: TrialHandle,
    /// Held until every process of the trial is gone.
    allocation: Allocation,
    /// When this run started, on the loop's clock (seconds).
    started: f64,
    /// When it last reported, on the loop's clock.
    last_report: f64,
    /// Set when this run must end; the reason decides the final state.
    ending: Option<Ending>,
    /// The cluster keeps what this run was given after its end (a job step
    /// it cannot end): not given back to the pool.
    stuck: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Ending {
    /// A stopper, the scheduler or the time budget ended it: TERMINATED.
    Stopped,
    /// Ctrl-C: back to PENDING, resumed later.
    Interrupted,
    /// The scheduler changed its number of workers: restarted from its
    /// latest checkpoint with that many.
    Resize(u32),
    /// The scheduler had it exploit another trial: restarted from the
    /// donor's checkpoint with the explored config.
    Exploit(Box<schedulers::Exploit>),
    /// The scheduler paused it: PAUSED, resumed from its checkpoint when
    /// the scheduler picks it.
    Paused,
    /// The trial broke a rule (e.g. no metric): ERROR with this message.
    Failed(String),
    /// No report within the hang timeout: killed, and a failure like a
    /// rank's death (restarted while `max_failures` allows).
    Hung(String),
}

impl Ending {
    /// The decision on a result this ending carries out, as its trial's
    /// record keeps it until the run has exited.
    pub(super) fn decided(&self) -> Option<Decision> {
        match self {
            Ending::Stopped => Some(Decision::Stop),
            Ending::Paused => Some(Decision::Pause),
            Ending::Resize(n) => Some(Decision::Resize { num_workers: *n }),
            Ending::Exploit(e) => Some(Decision::Exploit(e.clone())),
            // Not the scheduler's: the next run meets the same fate.
            Ending::Interrupted | Ending::Failed(_) | Ending::Hung(_) => None,
        }
    }
}

/// The trials by where they are.
#[derive(Default)]
pub(crate) struct Trials {
    running: HashMap<String, Running>,
    /// To (re)start before asking the searcher, first in line first.
    pending: VecDeque<TrialRecord>,
    /// PAUSED, oldest first: the scheduler picks which resumes.
    paused: pausing::PausedTrials,
    /// Index of the next trial to create.
    next_index: u64,
    /// Trials whose last run failed: their storage may hold a checkpoint
    /// half written, removed before they run again.
    dirty: HashSet<String>,
    /// Running trials waiting for their trainer's resources.
    booking: booking::Bookings,
}

/// A trial prepared off the loop before it (re)starts: its uncommitted
/// checkpoints removed (after a failed run), its checkpoint fetched from an
/// object store; and how that went (the fetched copy's local directory).
#[derive(Debug)]
pub(crate) struct Restored {
    record: TrialRecord,
    allocation: Allocation,
    fetched: Result<Option<PathBuf>, String>,
    /// An exploit's donor checkpoint (pinned), and the recipient's copy of it
    /// when the copy succeeded.
    exploit: Option<(CheckpointRecord, Option<CheckpointRecord>)>,
}

/// Trials being prepared off the loop, each an owned task: a panic comes
/// back as a `JoinError` naming the task, and becomes an error on its trial.
#[derive(Default)]
struct Restores {
    tasks: JoinSet<Box<Restored>>,
    /// What each task holds, to release it if the task never comes back.
    held: HashMap<TaskId, Held>,
}

/// What a restore task holds until it comes back.
struct Held {
    record: TrialRecord,
    allocation: Allocation,
    /// An exploit's donor trial and its checkpoint, pinned for the copy.
    pinned: Option<(String, String)>,
}

impl Restores {
    fn len(&self) -> usize {
        self.held.len()
    }
}

/// Where the sweep is in its life.
#[derive(Default)]
struct Phase {
    /// Set once no new trial may start (Ctrl-C, time budget, fail_fast, a stopper).
    stopping: bool,
    interrupts: u32,
    /// The searcher will suggest no more trials.
    searcher_done: bool,
    /// The scheduler was told no more trials will come.
    told_no_more: bool,
    /// The first trial error, for fail_fast's message.
    first_error: Option<String>,
    /// Nodes were lost and what is left can hold no trial: why the sweep stopped.
    out_of_nodes: Option<String>,
    /// The disk the experiment writes to filled up: the sweep stopped, to be resumed.
    disk_full: bool,
    /// When hangs were last looked for.
    last_hang_check: Option<Instant>,
}

/// What the dispatcher waits on besides the runner's own tasks.
pub(crate) struct Inputs {
    events: mpsc::UnboundedReceiver<Event>,
    flushed: mpsc::UnboundedReceiver<commits::FlushDone>,
}

/// The experiment loop and everything it owns.
pub(crate) struct Runner {
    settings: Settings,
    store: Store,
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    searcher: Box<dyn Searcher>,
    scheduler: Journaled,
    stopper: Box<dyn Stopper>,
    pool: ResourcePool,
    /// The checkpoint files: where they go, the file work queued per trial, `num_to_keep`.
    checkpoints: Checkpoints,
    trials: Trials,
    /// Trainers running inside trials (Ray Train V2's Tune pattern).
    inner: inner::InnerRuns,
    restores: Restores,
    commits: Commits,
    reporter: Reporter,
    keep: Option<keep::Keep>,
    phase: Phase,
    /// Whether reports wait for the loop's answer: unless nothing but
    /// Continue can be decided on a result (no scheduler that decides on
    /// results, no stopper) and the backend's ranks can go on without it.
    await_decisions: bool,
    events_tx: mpsc::UnboundedSender<Event>,
    /// Tests: the next restore task panics.
    #[cfg(test)]
    restore_panics: bool,
}

impl Runner {
    pub(crate) fn new(p: Parts) -> (Self, Inputs) {
        let (events_tx, events) = mpsc::unbounded_channel();
        let (commits, flushed) = Commits::new(p.store.clone(), p.settings.durability, p.unflushed);
        let trials = Trials { pending: p.pending, paused: p.paused.into(), next_index: p.next_index, ..Default::default() };
        let checkpoints = Checkpoints::new(p.storage, p.settings.checkpoint.clone());
        let decided = p.scheduler.scheduler().decides_on_results() || p.stopper.stops_trials();
        let await_decisions = decided || !p.backend.goes_on_unanswered();
        let runner = Self {
            settings: p.settings,
            store: p.store,
            backend: p.backend,
            clock: p.clock,
            searcher: p.searcher,
            scheduler: p.scheduler,
            stopper: p.stopper,
            pool: p.pool,
            checkpoints,
            trials,
            inner: inner::InnerRuns::default(),
            restores: Restores::default(),
            commits,
            reporter: p.reporter,
            keep: p.keep,
            phase: Phase::default(),
            await_decisions,
            events_tx,
            #[cfg(test)]
            restore_panics: false,
        };
        (runner, Inputs { events, flushed })
    }

    /// Runs the sweep to its end.
    pub(crate) async fn run(mut self, mut inputs: Inputs) -> Result<Finish, TuneError> {
        // Timers live across turns of the loop: re-creating them every turn
        // would re-register them with the timer driver each time.
        let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
        // A virtual clock's budget is checked every turn instead.
        let wall_budget = self.settings.time_budget.filter(|_| !self.clock.is_virtual());
        let budget = tokio::time::sleep_until(wall_budget.map_or(far, |b| tokio::time::Instant::now() + b));
        tokio::pin!(budget);
        let ends_timer = tokio::time::sleep_until(far);
        tokio::pin!(ends_timer);
        let mut ends_deadline: Option<tokio::time::Instant> = None;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let signal =
            |kind| tokio::signal::unix::signal(kind).map_err(|source| TuneError::Io { path: PathBuf::from("<signal handler>"), source });
        let mut sigint = signal(tokio::signal::unix::SignalKind::interrupt())?;
        let mut sigterm = signal(tokio::signal::unix::SignalKind::terminate())?;

        self.tell_capacity()?;
        loop {
            if self.advance()? {
                break;
            }
            // A trial's end rides on the next flush for results, or gets its own within END_FLUSH_DELAY.
            if !self.commits.ends_waiting() {
                ends_deadline = None;
            } else if ends_deadline.is_none() {
                let at = tokio::time::Instant::now() + END_FLUSH_DELAY;
                ends_deadline = Some(at);
                ends_timer.as_mut().reset(at);
            }
            if self.commits.is_idle() && self.restores.len() == 0 {
                // A virtual clock moves only once every event so far is acted on.
                self.clock.idle();
            }
            let budget_armed = !self.phase.stopping && wall_budget.is_some();
            let restoring = self.restores.len() > 0;
            // Not while a flush is under way (its end starts the next one): a
            // ready timer would otherwise win every turn of this biased select.
            let ends_armed = ends_deadline.is_some() && !self.commits.in_flight();
            let event = tokio::select! {
                biased;
                _ = async { tokio::select! { _ = sigint.recv() => {}, _ = sigterm.recv() => {} } } => LoopEvent::Interrupt,
                _ = &mut budget, if budget_armed => LoopEvent::BudgetSpent,
                Some(done) = self.restores.tasks.join_next_with_id(), if restoring => LoopEvent::Restored(done),
                Some((batch, result)) = inputs.flushed.recv() => LoopEvent::Flushed { batch, result },
                _ = &mut ends_timer, if ends_armed => LoopEvent::EndsDue,
                ev = inputs.events.recv() => {
                    let Some(first) = ev else { break };
                    let mut burst = vec![first];
                    while let Ok(ev) = inputs.events.try_recv() {
                        burst.push(ev);
                    }
                    LoopEvent::Trials(burst)
                }
                _ = tick.tick() => LoopEvent::Tick,
            };
            if self.handle(event)? == Control::Kill {
                // Trials still being prepared were never started: they stay as stored.
                self.commit_now()?;
                self.reporter.close().await;
                return Ok(Finish::Interrupted);
            }
        }
        self.finish().await
    }

    /// Acts on one event.
    pub(crate) fn handle(&mut self, event: LoopEvent) -> Result<Control, TuneError> {
        match event {
            LoopEvent::Interrupt => return self.interrupt(),
            LoopEvent::BudgetSpent => {
                if !self.phase.stopping {
                    self.out_of_time();
                }
            }
            LoopEvent::Restored(Ok((task, restored))) => {
                self.restores.held.remove(&task);
                self.on_restored(*restored)?;
            }
            LoopEvent::Restored(Err(e)) => {
                // The task panicked or was cancelled: its trial fails, the sweep goes on.
                if let Some(Held { record, allocation, pinned }) = self.restores.held.remove(&e.id()) {
                    self.pool.release(&allocation);
                    if let Some((donor_trial, uri)) = pinned {
                        // Its exploit is carried out when the trial runs again, copied anew.
                        self.checkpoints.unpin(&self.store, &donor_trial, &uri)?;
                    }
                    let why = if e.is_panic() { "panicked" } else { "was cancelled" };
                    let msg = format!("the preparation of its restart {why}: {e}");
                    tracing::error!(trial = %record.id, "{msg}");
                    self.failed_run(record, msg, Cause::Code)?;
                }
            }
            LoopEvent::Flushed { batch, result } => {
                if let Some(flushed) = self.commits.finished(batch, result) {
                    self.finish_flush(flushed)?;
                }
            }
            LoopEvent::EndsDue => self.start_commit(true)?,
            LoopEvent::Trials(events) => {
                for ev in events {
                    let span = tracing::debug_span!("trial", trial = %ev.trial_id);
                    let _in = span.enter();
                    self.on_trial_event(ev)?;
                }
                // Under a steady stream of events the tick may not get a turn.
                if self.phase.last_hang_check.is_none_or(|t| t.elapsed() >= TICK) {
                    self.detect_hangs();
                }
            }
            LoopEvent::Tick => {
                self.detect_hangs();
                let mut rows: Vec<&TrialRecord> = self.trials.running.values().map(|r| &r.record).collect();
                rows.sort_by_key(|r| r.index);
                let (paused, waiting) = (self.trials.paused.len(), self.trials.pending.len());
                self.reporter.report(Output::Tick { running: &rows, trials: self.trials.next_index, paused, waiting });
            }
        }
        Ok(Control::Go)
    }

    /// After an event: ends what the scheduler gave up on, admits trials
    /// while slots and resources allow, starts the group commit of what was
    /// stored, and hands the files for people on. True once the sweep is over.
    pub(crate) fn advance(&mut self) -> Result<bool, TuneError> {
        loop {
            self.stop_orphaned_trainers();
            self.apply_stopped()?;
            let spent = self.settings.time_budget.is_some_and(|b| self.clock.now() >= b.as_secs_f64());
            if spent && !self.phase.stopping {
                self.out_of_time();
            }
            self.admit()?;
            // Group commit for the burst just handled; after admitting, so a
            // freed slot is refilled without waiting for the flush.
            self.start_commit(false)?;
            self.reporter.flush();
            let idle = self.trials.running.is_empty() && self.restores.len() == 0;
            if !idle {
                return Ok(false);
            }
            if !self.phase.stopping && !self.trials.paused.is_empty() && !self.phase.told_no_more {
                // Nothing runs and nothing new starts: the scheduler decides with what it has.
                self.tell_no_more()?;
                continue;
            }
            let finished = self.phase.searcher_done && self.trials.pending.is_empty();
            if !self.phase.stopping && !finished {
                // The searcher waits on trials, yet none runs: it can never proceed.
                tracing::warn!("the searcher is waiting but no trial is running; ending the sweep");
            }
            return Ok(true);
        }
    }

    /// The sweep is over: paused trials nothing will resume end, the
    /// scheduler's state and every result are made durable, background file
    /// work and the files for people are finished.
    async fn finish(mut self) -> Result<Finish, TuneError> {
        if self.phase.interrupts == 0 && !self.phase.stopping {
            // Nothing will resume them: the scheduler left them behind.
            for rec in self.trials.paused.take() {
                self.scheduler.on_trial_complete(&view(&rec), rec.last_result.as_ref())?;
                self.terminate_paused(rec)?;
            }
        }
        // A sweep that keeps its best trials only cannot be resumed: its
        // scheduler's state (ASHA's: a score per trial and rung) is not written.
        if self.keep.is_none() {
            self.scheduler.finish()?;
        }
        self.commit_now()?;
        // A replay syncs here only (a real sweep synced every batch already).
        self.store.flush()?;
        self.checkpoints.drain().await;
        let (interrupted, fail_fast, first_error) = (self.phase.interrupts > 0, self.settings.fail_fast, self.phase.first_error.take());
        let out_of_nodes = self.phase.out_of_nodes.take();
        self.reporter.close().await;
        if interrupted {
            return Ok(Finish::Interrupted);
        }
        if self.phase.disk_full {
            let source = std::io::Error::from_raw_os_error(libc::ENOSPC);
            return Err(TuneError::Io { path: self.settings.exp_dir.clone(), source });
        }
        if let Some(msg) = out_of_nodes {
            return Err(TuneError::Cluster(msg));
        }
        if let (true, Some(e)) = (fail_fast, first_error) {
            return Err(TuneError::FailFast(e));
        }
        Ok(Finish::Done)
    }

    fn interrupt(&mut self) -> Result<Control, TuneError> {
        self.phase.interrupts += 1;
        if self.phase.interrupts == 1 {
            self.reporter.report(Output::Stopping(
                StopReason::Interrupted,
                "Interrupted: stopping running trials (Ctrl-C again to kill them)".into(),
            ));
            self.phase.stopping = true;
            for r in self.trials.running.values_mut() {
                r.ending = Some(Ending::Interrupted);
                r.handle.stop(StopLevel::Graceful);
            }
            return Ok(Control::Go);
        }
        self.reporter.report(Output::Stopping(StopReason::Killed, "Killing running trials".into()));
        self.inner.kill_all();
        for (_, mut r) in std::mem::take(&mut self.trials.running) {
            r.handle.stop(StopLevel::Kill);
            r.record.status = TrialStatus::Pending;
            self.store.put_trial(&r.record)?;
        }
        Ok(Control::Kill)
    }

    /// Admits trials while there are free slots and resources for all of a trial's bundles.
    fn admit(&mut self) -> Result<(), TuneError> {
        if self.phase.stopping {
            return Ok(());
        }
        // Running trials' trainers first; no new trial while one waits for its resources.
        self.grant_bookings()?;
        if self.trials.booking.any() {
            return Ok(());
        }
        while !self.phase.stopping && self.trials.running.len() + self.restores.len() < self.settings.max_concurrent {
            let Some(allocation) = self.pool.try_allocate(&self.settings.request) else { break };
            let Some(record) = self.next_trial()? else {
                self.pool.release(&allocation);
                break;
            };
            // A trial whose number of workers was changed needs its own bundles.
            let request = self.request_for(&record);
            if let Some(why) = self.cannot_run(&record, &request) {
                self.pool.release(&allocation);
                self.give_up(record, why)?;
                continue;
            }
            let allocation = if request == self.settings.request {
                allocation
            } else {
                self.pool.release(&allocation);
                match self.pool.try_allocate(&request) {
                    Some(a) => a,
                    None => {
                        // It waits, first in line, for workers to free up.
                        self.trials.pending.push_front(record);
                        break;
                    }
                }
            };
            self.start(record, allocation)?;
        }
        Ok(())
    }

    /// The trial to run next: one restarting, one the scheduler resumes,
    /// or a new one from the searcher.
    fn next_trial(&mut self) -> Result<Option<TrialRecord>, TuneError> {
        if let Some(record) = self.trials.pending.pop_front() {
            return Ok(Some(record));
        }
        let can_add = !self.phase.searcher_done && self.trials.next_index < self.settings.max_trials;
        if let Some(record) = self.resume_paused(can_add)? {
            return Ok(Some(record));
        }
        if can_add {
            let id = trial_id(self.trials.next_index);
            match self.searcher.suggest(&id) {
                Suggestion::Config(config) => {
                    let mut record = TrialRecord::new(id, self.trials.next_index, config, self.clock.unix_now());
                    record.num_workers = self.settings.workers_from.as_deref().map(|path| workers_in(&record.config, path));
                    self.trials.next_index += 1;
                    self.store.create_trial(&record, &self.searcher.save())?;
                    self.scheduler.on_trial_add(&view(&record))?;
                    return Ok(Some(record));
                }
                Suggestion::Wait => {}
                Suggestion::Finished => self.phase.searcher_done = true,
            }
        } else {
            self.phase.searcher_done = true;
        }
        if self.phase.searcher_done && !self.phase.told_no_more {
            self.tell_no_more()?;
        }
        self.resume_paused(false)
    }

    /// Tells the scheduler no new trial will come, and ends what it gives up on.
    fn tell_no_more(&mut self) -> Result<(), TuneError> {
        self.phase.told_no_more = true;
        self.scheduler.on_no_more_trials()?;
        self.apply_stopped()
    }

    /// Starts `record` on `allocation`: at once, or after its preparation
    /// off the loop (a failed run's leftovers removed, an exploit's
    /// checkpoint copied from its donor, a checkpoint fetched from an object store).
    fn start(&mut self, mut record: TrialRecord, allocation: Allocation) -> Result<(), TuneError> {
        // A run starts from committed checkpoints only: its own, or its donor's.
        let donor = record.pending_exploit.as_ref().map(|e| e.donor.as_str());
        if self.commits.holds(&record.id) || donor.is_some_and(|d| self.commits.holds(d)) {
            self.commit_now()?;
        }
        let exploit = self.prepare_exploit(&mut record)?;
        let workers = self.request_for(&record).workers.len().max(1) as u32;
        let fetch = if exploit.is_some() { Ok(None) } else { self.checkpoints.to_fetch(&record, workers) };
        let fetch = match fetch {
            Ok(fetch) => fetch,
            Err(msg) => {
                self.pool.release(&allocation);
                return self.give_up(record, msg);
            }
        };
        // Ranks that read the store themselves restore from it: the driver downloads nothing.
        let direct = !self.checkpoints.storage().is_local() && self.backend.restores_from_store();
        if (fetch.is_none() || direct) && exploit.is_none() && !self.trials.dirty.contains(&record.id) {
            let local = self.local_checkpoint(&record);
            return self.launch(record, allocation, local);
        }
        let cleanup = self.trials.dirty.remove(&record.id).then(|| self.checkpoints.cleanup(&self.store, &record.id)).transpose()?;
        let (storage, scratch) = (self.checkpoints.storage().clone(), self.trial_dir(&record.id).join("restore"));
        let trial_storage = self.checkpoints.of_trial(&record.id);
        let settled = self.checkpoints.settled(&record.id);
        let pinned = exploit
            .as_ref()
            .map(|job| (record.pending_exploit.as_ref().map(|e| e.donor.clone()).unwrap_or_default(), job.donor.uri.clone()));
        let held = Held { record: record.clone(), allocation: allocation.clone(), pinned };
        #[cfg(test)]
        let panics = std::mem::take(&mut self.restore_panics);
        let span = tracing::info_span!("trial", trial = %record.id);
        let task = async move {
            #[cfg(test)]
            if panics {
                panic!("injected: a restore task panics");
            }
            let mut copied = None;
            let fetched = async {
                // Its deletions and markers still under way go first.
                settled.await;
                if let Some((trial, keep)) = cleanup {
                    remove_uncommitted(&trial, &keep).await.map_err(|e| e.to_string())?;
                }
                let mut fetch = fetch;
                if let Some(job) = &exploit {
                    for uri in &job.replaced {
                        tracing::debug!(checkpoint = %uri, "deleting a checkpoint an exploit replaces");
                        storage.delete_checkpoint(uri).await.map_err(|e| e.to_string())?;
                    }
                    tracing::debug!(donor = %job.donor.uri, "copying the donor's checkpoint");
                    let uri = storage
                        .copy_checkpoint(&job.donor.uri, &trial_storage)
                        .await
                        .map_err(|e| format!("could not copy its donor's checkpoint {}: {e}", job.donor.uri))?;
                    copied = Some(CheckpointRecord { uri: uri.clone(), ..job.donor.clone() });
                    fetch = (!storage.is_local()).then_some(uri);
                }
                match fetch {
                    Some(uri) if !direct => storage.fetch_checkpoint(&uri, &scratch).await.map(Some).map_err(|e| e.to_string()),
                    _ => Ok(None),
                }
            }
            .await;
            let exploit = exploit.map(|job| (job.donor, copied));
            Box::new(Restored { record, allocation, fetched, exploit })
        };
        let handle = self.restores.tasks.spawn(tracing::Instrument::instrument(task, span));
        self.restores.held.insert(handle.id(), held);
        Ok(())
    }

    /// A trial's preparation is over: it launches, or fails, or (an exploit
    /// whose copy failed) goes back in line to run from its own checkpoint.
    fn on_restored(&mut self, restored: Restored) -> Result<(), TuneError> {
        let Restored { mut record, allocation, mut fetched, exploit } = restored;
        let mut dropped = false;
        if let Some((donor, copy)) = exploit {
            let donor_trial = record.pending_exploit.as_ref().map(|e| e.donor.clone()).unwrap_or_default();
            match (&fetched, copy) {
                _ if self.phase.stopping => {}
                (Ok(_), Some(copy)) => {
                    let (uri, iteration) = (copy.uri.clone(), copy.iteration);
                    self.finish_exploit(&mut record, &donor, copy)?;
                    if self.settings.durability == Durability::AtEnd {
                        self.checkpoints.apply_retention(&self.store, &record.id)?;
                    } else {
                        // The copy is a committed checkpoint like any other: durable, then marked.
                        self.store.flush_local()?;
                        self.checkpoints.committed(&self.store, &record.id, &uri, iteration)?;
                    }
                }
                (Err(msg), None) => {
                    // The copy failed: no exploit, and no failure either; it goes on from its own checkpoint.
                    self.reporter.report(Output::Event(Out::Message(format!("{} does not exploit {donor_trial}: {msg}", record.id))));
                    record.pending_exploit = None;
                    dropped = true;
                }
                (Ok(_), None) => fetched = Err("its exploit's copy went missing".into()),
                (Err(_), Some(_)) => {}
            }
            self.checkpoints.unpin(&self.store, &donor_trial, &donor.uri)?;
        }
        match fetched {
            _ if dropped => {
                self.pool.release(&allocation);
                self.store.put_trial(&record)?;
                // What the copy left half done goes before it runs.
                self.trials.dirty.insert(record.id.clone());
                self.trials.pending.push_front(record);
                Ok(())
            }
            _ if self.phase.stopping => {
                // Never started: it stays as stored, resumed later.
                self.pool.release(&allocation);
                Ok(())
            }
            Ok(fetched) => {
                let local = fetched.or_else(|| self.local_checkpoint(&record));
                self.launch(record, allocation, local)
            }
            Err(msg) => {
                self.pool.release(&allocation);
                // Its checkpoint could not be fetched or copied (a store gone): not the trial's doing.
                self.failed_run(record, format!("could not prepare its restart: {msg}"), Cause::Infrastructure)
            }
        }
    }

    /// Launches a run of `record` on `allocation` from `checkpoint`.
    fn launch(&mut self, mut record: TrialRecord, allocation: Allocation, checkpoint: Option<PathBuf>) -> Result<(), TuneError> {
        let span = tracing::info_span!("trial", trial = %record.id);
        let _in = span.enter();
        // A paused trial resuming is not a restart, nor is one restarting from the checkpoint it exploited.
        let exploited = record.pending_exploit.take().is_some();
        let resized = std::mem::take(&mut record.resizing);
        let restart = !exploited
            && !resized
            && record.status != TrialStatus::Paused
            && (record.status != TrialStatus::Pending || record.started_at.is_some());
        if restart {
            record.restarts += 1;
        }
        let resumed = record.status == TrialStatus::Paused;
        if resumed {
            record.resumes += 1;
        }
        record.status = TrialStatus::Running;
        record.started_at = Some(self.clock.unix_now());
        record.resources = allocation.workers.clone();
        // Where the trial's checkpoints lie in a store its ranks read themselves, they restore from there.
        let checkpoint_uri = record
            .latest_checkpoint
            .as_ref()
            .filter(|_| !self.checkpoints.storage().is_local() && self.backend.restores_from_store())
            .map(|c| c.uri.clone());
        let spec = LaunchSpec {
            trial_id: record.id.clone(),
            config: record.config.clone(),
            trial_dir: self.trial_dir(&record.id),
            checkpoint: if checkpoint_uri.is_some() { None } else { checkpoint },
            start_iteration: record.latest_checkpoint.as_ref().map_or(0, |c| c.iteration),
            checkpoint_frequency: self.settings.checkpoint.every().unwrap_or(0),
            workers: allocation.workers.clone(),
            storage: self.checkpoints.of_trial(&record.id),
            checkpoint_uri,
            checkpoint_roots: self.settings.checkpoint.allowed_dirs.clone(),
            datasets: self.settings.datasets.clone(),
            await_decisions: self.await_decisions,
        };
        match self.backend.launch(spec, self.events_tx.clone()) {
            Ok(handle) => {
                self.store.put_trial(&record)?;
                // A start is shown after the ends not yet shown (they wait to be durable).
                self.reporter.report(Output::Started { record: &record, after_ends: self.commits.ends_pending(), resumed });
                let now = self.clock.now();
                let running = Running { record, handle, allocation, started: now, last_report: now, ending: None, stuck: false };
                self.trials.running.insert(running.record.id.clone(), running);
            }
            Err(e) => {
                self.pool.release(&allocation);
                // The trial could not start: it is an error, the sweep goes on.
                record.status = TrialStatus::Error;
                record.error = Some(e.to_string());
                record.ended_at = Some(self.clock.unix_now());
                self.store.put_trial(&record)?;
                self.scheduler.on_trial_error(&view(&record))?;
                self.searcher.on_trial_complete(&record.id, None, true);
                self.commits.push_end(record);
            }
        }
        Ok(())
    }

    fn on_trial_event(&mut self, ev: Event) -> Result<(), TuneError> {
        if self.inner.owns(&ev.trial_id) {
            return self.on_inner_event(ev);
        }
        match ev.kind {
            EventKind::Report { report, reply } => {
                if self.trials.running.contains_key(&ev.trial_id) {
                    // Stored, decided on and answered now; acknowledged once durable.
                    let result = self.store_report(&ev.trial_id, report)?;
                    let directive = self.decide(&result)?;
                    if directive == Directive::Stop && !self.await_decisions {
                        // Its ranks did not wait for this answer: they read it as a stop request.
                        if let Some(r) = self.trials.running.get(&ev.trial_id) {
                            r.handle.stop(StopLevel::Graceful);
                        }
                    }
                    let ack = reply.send(directive);
                    self.commits.push_report(Stored { result, ack });
                } else {
                    // Not stored: never acknowledged.
                    drop(reply.send(Directive::Stop));
                }
            }
            EventKind::NodeLost { node, why } => self.set_aside(&node, &why),
            EventKind::Book { request, reply } => self.on_book(&ev.trial_id, request, reply)?,
            EventKind::RunTrainer { run, updates } => self.on_run_trainer(&ev.trial_id, *run, updates)?,
            EventKind::Stuck => {
                if let Some(r) = self.trials.running.get_mut(&ev.trial_id) {
                    r.stuck = true;
                }
            }
            EventKind::Exited(outcome) => self.on_exit(&ev.trial_id, outcome)?,
        }
        Ok(())
    }

    /// A batch is durable: its results are acknowledged to their workers,
    /// its checkpoints committed, its trial ends shown.
    fn finish_flush(&mut self, (mut batch, flushed): (Batch, Result<(), StoreError>)) -> Result<(), TuneError> {
        // On failure the acknowledgements are dropped, which their workers
        // read as never coming: nothing not durable is ever acknowledged.
        flushed?;
        let at_end = self.settings.durability == Durability::AtEnd;
        for Stored { result, ack } in batch.reports {
            if !at_end {
                ack.durable();
                if let Some(uri) = &result.checkpoint {
                    self.checkpoints.committed(&self.store, &result.trial_id, uri, result.training_iteration)?;
                }
            }
            self.reporter.report(Output::Result { result: &result, checkpoint: !at_end });
        }
        self.show_ended(&mut batch.ended)?;
        if at_end {
            return Ok(());
        }
        self.scheduler.maintain();
        Ok(())
    }

    /// Starts the group commit of what is stored (`force`: trial ends
    /// alone too). The scheduler's calls go with it: what they led to is
    /// stored by now.
    fn start_commit(&mut self, force: bool) -> Result<(), TuneError> {
        self.scheduler.release();
        match self.commits.start(force) {
            Some(flushed) => self.finish_flush(flushed),
            None => Ok(()),
        }
    }

    /// Makes everything stored so far durable and acts on it, now.
    fn commit_now(&mut self) -> Result<(), TuneError> {
        self.scheduler.release();
        for batch in self.commits.now()? {
            self.finish_flush((batch, Ok(())))?;
        }
        Ok(())
    }

    /// Trial ends are durable: shown, then (with `keep_best`) the worst
    /// finished trials let go of.
    fn show_ended(&mut self, ended: &mut Vec<TrialRecord>) -> Result<(), TuneError> {
        for r in ended.drain(..) {
            self.reporter.report(Output::Ended(&r));
            if let Some(keep) = &mut self.keep {
                keep.ended(&self.store, &r)?;
            }
        }
        if !self.commits.ends_pending() {
            self.reporter.report(Output::EndsShown);
        }
        Ok(())
    }

    /// A node the backend found lost leaves the pool for the rest of the
    /// sweep; when what is left can hold no trial, the sweep stops, its
    /// trials left to resume in another allocation.
    fn set_aside(&mut self, node: &str, why: &str) {
        if !self.pool.set_aside(node) {
            return;
        }
        self.reporter.report(Output::Event(Out::NodeSetAside { node: node.to_string(), why: why.to_string() }));
        if let (Err(e), None) = (self.pool.check(&self.settings.request), &self.phase.out_of_nodes) {
            let msg = format!("{e}: continue it in an allocation with more nodes (nestor resume {})", self.settings.exp_dir.display());
            self.reporter.report(Output::Stopping(StopReason::OutOfNodes, format!("stopping the sweep: {msg}")));
            self.phase.out_of_nodes = Some(msg);
            self.phase.stopping = true;
            for r in self.trials.running.values_mut() {
                r.ending.get_or_insert(Ending::Interrupted);
                r.handle.stop(StopLevel::Graceful);
            }
        }
    }

    fn on_exit(&mut self, trial_id: &str, outcome: ExitOutcome) -> Result<(), TuneError> {
        if self.defer_exit(trial_id, &outcome) {
            return Ok(()); // its trainer's ranks still run on its bundles
        }
        let Some(mut r) = self.trials.running.remove(trial_id) else { return Ok(()) };
        // The backend reports an exit only once every process is gone; what a stuck run held stays booked.
        if r.stuck {
            self.pool.keep_booked(&r.allocation);
        } else {
            self.pool.release(&r.allocation);
        }
        self.trials.booking.forget(trial_id);
        r.record.time_total_s += (self.clock.now() - r.started).max(0.0);
        let mut rec = r.record;
        // Carried out now.
        rec.decided = None;
        let ending = r.ending.take();
        // A run told to end for the scheduler's sake that the infrastructure
        // ended first has ended as asked: its committed checkpoints stand.
        let outcome = match (&ending, outcome) {
            (Some(Ending::Stopped | Ending::Paused | Ending::Exploit(_) | Ending::Resize(_)), ExitOutcome::Infrastructure(_)) => {
                ExitOutcome::Stopped
            }
            (_, o) => o,
        };
        match (ending, outcome) {
            (Some(Ending::Interrupted), _) => {
                rec.status = TrialStatus::Pending;
                self.store.put_trial(&rec)?;
                self.commits.push_end(rec);
            }
            (Some(Ending::Paused), ExitOutcome::Completed | ExitOutcome::Stopped) => {
                rec.status = TrialStatus::Paused;
                self.store.put_trial(&rec)?;
                self.searcher.on_trial_pause(&rec.id);
                self.trials.paused.insert(rec.clone());
                self.commits.push_end(rec);
            }
            (Some(Ending::Resize(n)), ExitOutcome::Completed | ExitOutcome::Stopped) => {
                // It restarts from its latest checkpoint with `n` workers, first in line (also after a crash).
                let was = rec.resources.len().max(1);
                rec.status = TrialStatus::Pending;
                rec.num_workers = Some(n);
                rec.resizing = true;
                rec.resizes += 1;
                self.store.put_trial(&rec)?;
                let from = rec.latest_checkpoint.as_ref().map_or("its start".to_string(), |c| checkpoint_name(&c.uri).to_string());
                self.reporter.report(Output::Event(Out::Resized { trial_id: rec.id.clone(), was, workers: n as usize, from }));
                self.trials.pending.push_front(rec);
            }
            (Some(Ending::Exploit(e)), ExitOutcome::Completed | ExitOutcome::Stopped) => {
                // Carried out before it runs again (first in line), also after a crash.
                rec.status = TrialStatus::Pending;
                rec.pending_exploit = Some(*e);
                self.store.put_trial(&rec)?;
                self.trials.pending.push_front(rec);
            }
            (Some(Ending::Failed(msg)), _) | (Some(Ending::Stopped), ExitOutcome::Failed(msg)) => {
                self.give_up(rec, msg)?;
            }
            // The infrastructure ended it (a node lost under it): not the code's failure, whatever was asked of it.
            (_, ExitOutcome::Infrastructure(msg)) => {
                self.failed_run(rec, msg, Cause::Infrastructure)?;
            }
            (Some(Ending::Hung(msg)), _)
            | (None | Some(Ending::Paused | Ending::Exploit(_) | Ending::Resize(_)), ExitOutcome::Failed(msg)) => {
                self.failed_run(rec, msg, Cause::Code)?;
            }
            (_, ExitOutcome::Completed | ExitOutcome::Stopped) => {
                rec.status = TrialStatus::Terminated;
                rec.error = None;
                rec.ended_at = Some(self.clock.unix_now());
                self.store.put_trial(&rec)?;
                self.scheduler.on_trial_complete(&view(&rec), rec.last_result.as_ref())?;
                self.searcher.on_trial_complete(&rec.id, rec.last_result.as_ref(), false);
                // What the searcher learnt from it survives a crash (it is durable with the trial's end).
                if self.settings.durability == Durability::EveryBatch {
                    self.store.put_searcher(&self.searcher.save())?;
                }
                self.commits.push_end(rec);
            }
        }
        Ok(())
    }

    /// Stores one report of running trial `trial` as a result (not yet durable) and returns it.
    fn store_report(&mut self, trial: &str, report: Report) -> Result<Arc<TrialResult>, TuneError> {
        let (now, unix) = (self.clock.now(), self.clock.unix_now());
        let Some(r) = self.trials.running.get_mut(trial) else {
            return Err(TuneError::Corrupt(self.settings.exp_dir.clone(), format!("{trial}: a report of a trial not running")));
        };
        let rec = &mut r.record;
        let mut metrics: Metrics = report.metrics;
        let mut extra = report.extra;
        if self.settings.rank_metrics && !report.rank_metrics.is_empty() {
            let ranks = serde_json::Value::Array(report.rank_metrics.iter().map(search::metrics_serde::to_json).collect());
            match &mut extra {
                Some(serde_json::Value::Object(values)) => {
                    values.insert("rank_metrics".into(), ranks);
                }
                _ => extra = Some(serde_json::json!({ "rank_metrics": ranks })),
            }
        }
        metrics.insert("time_this_iter_s".into(), (now - r.last_report).max(0.0));
        metrics.insert("time_total_s".into(), rec.time_total_s + (now - r.started).max(0.0));
        metrics.insert("timestamp".into(), unix);
        metrics.insert("training_iteration".into(), report.training_iteration as f64);
        r.last_report = now;
        let result = TrialResult {
            extra,
            trial_id: rec.id.clone(),
            seq: rec.num_results,
            training_iteration: report.training_iteration,
            metrics,
            checkpoint: report.checkpoint.as_ref().map(|c| c.uri.clone()),
        };
        // Durable before anyone acts on it: stored here, flushed by the group commit.
        self.store.put_result(&result)?;
        rec.num_results += 1;
        if let Some(c) = report.checkpoint {
            let ckpt = CheckpointRecord {
                version: RECORD_VERSION,
                iteration: report.training_iteration,
                uri: c.uri,
                ranks: c.ranks,
                world_size: c.world_size,
                metrics: result.metrics.clone(),
            };
            self.store.put_checkpoint(&rec.id, &ckpt)?;
            rec.latest_checkpoint = Some(ckpt);
        }
        rec.last_result = Some(result.clone());
        // The trial's record is rewritten at its start and end only; in between,
        // its results and checkpoints trees are the truth (see Store::refresh_trial).
        Ok(Arc::new(result))
    }

    /// What a stored result means for its trial: the answer to its workers.
    fn decide(&mut self, result: &TrialResult) -> Result<Directive, TuneError> {
        let Some(r) = self.trials.running.get_mut(&result.trial_id) else { return Ok(Directive::Stop) };
        if let Some(msg) = missing_metric(self.settings.metric.as_deref(), self.scheduler.scheduler(), result) {
            r.ending = Some(Ending::Failed(msg));
            r.handle.stop(StopLevel::Graceful);
            return Ok(Directive::Stop);
        }
        let decision = self.scheduler.on_trial_result(&view(&r.record), result)?;
        // `done: true` in a report ends its trial, as in Ray.
        let stop = self.stopper.should_stop_trial(&result.trial_id, result) | result.done();
        self.searcher.on_trial_result(&result.trial_id, result);
        let directive = if r.ending.is_some() {
            Directive::Stop
        } else {
            // A trial that meets its stop criteria is complete, whatever else was decided:
            // pausing it (or restarting it elsewhere) would leave nothing to resume.
            let ending = if stop { Some(Ending::Stopped) } else { ending_of(decision, &r.record, result) };
            let directive = if ending.is_some() { Directive::Stop } else { Directive::Continue };
            // Stored before the scheduler's call is released to its journal:
            // a crash before the run exits leaves the decision to carry out.
            r.record.decided = ending.as_ref().and_then(Ending::decided);
            if r.record.decided.is_some() {
                self.store.put_trial(&r.record)?;
            }
            r.ending = ending;
            directive
        };
        if self.stopper.should_stop_all() {
            if !self.phase.stopping {
                self.reporter.report(Output::Stopping(StopReason::Stopper, "A stopper ended the sweep: stopping running trials".into()));
            }
            self.stop_all();
            return Ok(Directive::Stop);
        }
        Ok(directive)
    }

    /// The time budget is spent: no new trial starts, the running ones stop.
    fn out_of_time(&mut self) {
        self.reporter.report(Output::Stopping(StopReason::TimeBudget, "Time budget reached: stopping running trials".into()));
        self.stop_all();
    }

    /// No new trial starts; the running ones stop (TERMINATED).
    fn stop_all(&mut self) {
        self.phase.stopping = true;
        for r in self.trials.running.values_mut() {
            r.ending.get_or_insert(Ending::Stopped);
            r.handle.stop(StopLevel::Graceful);
        }
    }

    fn trial_dir(&self, id: &str) -> PathBuf {
        self.settings.exp_dir.join("trials").join(id)
    }

    /// A local checkpoint's directory, found by name in the trial's
    /// directory (wherever the experiment now is).
    fn local_checkpoint(&self, record: &TrialRecord) -> Option<PathBuf> {
        let trial_dir = self.trial_dir(&record.id);
        record.latest_checkpoint.as_ref().map(|c| trial_dir.join(checkpoint_name(&c.uri)))
    }

    /// What `record` asks for: the experiment's request, with as many
    /// workers as a resource-changing scheduler gave it.
    fn request_for(&self, record: &TrialRecord) -> Request {
        let request = &self.settings.request;
        match record.num_workers {
            Some(n) if n as usize != request.workers.len() => {
                let worker = request.workers.first().cloned().unwrap_or_default();
                Request { workers: vec![worker; n.max(1) as usize], ..request.clone() }
            }
            _ => request.clone(),
        }
    }

    /// Why `record` can never run with `request`, if so: a number of workers
    /// from its config that is not one, or bundles the node can never hold.
    fn cannot_run(&self, record: &TrialRecord, request: &Request) -> Option<String> {
        if let (Some(path), Some(0)) = (&self.settings.workers_from, record.num_workers) {
            let value = config_at(&record.config, path).map_or("nothing".to_string(), |v| v.to_string());
            return Some(format!("trainer.num_workers_from: its config's {path} is {value}, not a number of workers (an integer >= 1)"));
        }
        if request == &self.settings.request {
            return None;
        }
        self.pool.check(request).err().map(|e| {
            format!("{} workers (config {}): {e}", request.workers.len(), self.settings.workers_from.as_deref().unwrap_or("num_workers"))
        })
    }

    /// Tells the scheduler how many workers of the experiment's size the node holds.
    fn tell_capacity(&mut self) -> Result<(), TuneError> {
        let request = &self.settings.request;
        let one = Request { workers: request.workers.iter().take(1).cloned().collect(), ..request.clone() };
        let mut probe = self.pool.clone();
        let mut workers = 0u32;
        // Each trial's trainer share is counted once per worker here: a lower bound.
        while workers < 100_000 && probe.try_allocate(&one).is_some() {
            workers += 1;
        }
        let trial_workers = request.workers.len().max(1) as u32;
        if let Some(jobs) = self.pool.job_slots() {
            // A job per run: as many runs of the experiment's size as jobs.
            workers = jobs as u32 * trial_workers;
        }
        self.scheduler.on_capacity(Capacity { workers: workers.max(trial_workers), trial_workers })
    }
}

/// Why `result` breaks a rule: it lacks the experiment's metric or one the
/// scheduler needs.
fn missing_metric(metric: Option<&str>, scheduler: &dyn Scheduler, result: &TrialResult) -> Option<String> {
    let reported = || result.metrics.keys().map(String::as_str).collect::<Vec<_>>().join(", ");
    if let Some(metric) = metric {
        if !result.metrics.contains_key(metric) {
            return Some(format!("trial reported no `{metric}` (the experiment's metric); it reported: {}", reported()));
        }
    }
    for (setting, name) in scheduler.required_metrics() {
        if result.metric(&name).is_none() {
            return Some(format!("trial reported no `{name}` ({setting}); it reported: {}", reported()));
        }
    }
    None
}

/// How the scheduler's decision on `result` ends the run of `record`, if it does.
fn ending_of(decision: Decision, record: &TrialRecord, result: &TrialResult) -> Option<Ending> {
    match decision {
        Decision::Continue => None,
        Decision::Stop => Some(Ending::Stopped),
        Decision::Pause => Some(Ending::Paused),
        Decision::Exploit(e) if e.trial_id == record.id => Some(Ending::Exploit(e)),
        Decision::Exploit(e) => {
            tracing::warn!(trial = %record.id, "ignoring an exploit naming another trial ({})", e.trial_id);
            None
        }
        // Only from the checkpoint of this result, and one the new number of workers can restore.
        Decision::Resize { num_workers } => {
            match record.latest_checkpoint.as_ref().filter(|c| Some(&c.uri) == result.checkpoint.as_ref()) {
                Some(c) if c.required_world_size().is_none_or(|n| n == num_workers) => Some(Ending::Resize(num_workers)),
                Some(c) => {
                    tracing::warn!(trial = %record.id, "not resizing: checkpoint {} holds the shards of {} ranks", c.uri, c.world_size);
                    None
                }
                None => {
                    tracing::warn!(trial = %record.id, "not resizing: its result carried no committed checkpoint");
                    None
                }
            }
        }
    }
}

pub(crate) fn view(record: &TrialRecord) -> TrialView<'_> {
    TrialView {
        id: &record.id,
        config: &record.config,
        status: record.status,
        num_results: record.num_results,
        num_workers: record.num_workers.unwrap_or(record.resources.len().max(1) as u32),
    }
}

/// The value at dotted `path` of `config`.
fn config_at<'a>(config: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.').try_fold(config, |v, key| v.get(key))
}

/// The number of workers at `path` of `config`: 0 when it is not a whole number >= 1 (refused at admission).
fn workers_in(config: &serde_json::Value, path: &str) -> u32 {
    match config_at(config, path) {
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0 && *f >= 1.0).map(|f| f as u64))
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        None => 0,
    }
}
