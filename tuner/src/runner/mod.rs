//! The experiment loop: one task owns all mutable experiment state and is
//! fed by one channel of trial events. It admits trials, stores every result
//! before the scheduler sees it, and answers workers once their result is
//! durable.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use schedulers::{Capacity, Decision, Exploit, Scheduler, Stopper, TrialStatus, TrialView};
use search::{Metrics, Searcher, Suggestion, TrialResult};
use trainer::{
    Allocation, Backend, Directive, Event, EventKind, ExitOutcome, LaunchSpec, Reply, Report, Request, ResourcePool, StopLevel, Storage,
    TrialHandle,
};

use crate::config::{CheckpointConfig, FailureConfig};

use crate::files::{FileWrite, Flusher};
use crate::progress::Progress;
use crate::store::{CheckpointRecord, Store, StoreError, TrialRecord, RECORD_VERSION};
use crate::TuneError;

mod checkpoints;
mod exploits;
mod failures;
mod pausing;

pub(crate) use checkpoints::{remove_uncommitted, Background};
pub(crate) use exploits::config_change;

/// The live-status file in the experiment directory, present while a sweep runs.
pub(crate) const SNAPSHOT: &str = "status.json";

/// Batches up to this many results are flushed on the loop itself; larger
/// ones off it, while the next batch forms.
const INLINE_FLUSH: usize = 2;

/// Longest a trial's end waits for a flush when no worker is waiting for one.
const END_FLUSH_DELAY: Duration = Duration::from_millis(20);

/// Seconds since the Unix epoch.
pub(crate) fn now_unix() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// `checkpoint_000007` for `.../checkpoint_000007` (a path or a URL).
pub(crate) fn checkpoint_name(uri: &str) -> &str {
    uri.trim_end_matches('/').rsplit('/').next().unwrap_or(uri)
}

/// The trial id of the trial with creation index `index`.
pub(crate) fn trial_id(index: u64) -> String {
    format!("trial_{index:05}")
}

/// A result stored in the current burst, and the worker waiting on it.
struct Stored {
    result: Arc<TrialResult>,
    reply: Reply,
}

/// Results and trial ends waiting to be durable, and the flush under way.
/// One flush runs at a time, off the loop; what arrives meanwhile forms the
/// next batch, flushed as soon as the current one is done.
struct Commits {
    /// Stored since the last flush started.
    reports: Vec<Stored>,
    /// Trials that ended since the last flush started: shown as ended once durable.
    ended: Vec<TrialRecord>,
    /// The batch being flushed now.
    inflight: Option<Batch>,
    flushed_tx: mpsc::UnboundedSender<Result<(), StoreError>>,
    flushed_rx: mpsc::UnboundedReceiver<Result<(), StoreError>>,
}

struct Batch {
    reports: Vec<Stored>,
    ended: Vec<TrialRecord>,
}

impl Commits {
    fn new() -> Self {
        let (flushed_tx, flushed_rx) = mpsc::unbounded_channel();
        Self { reports: Vec::new(), ended: Vec::new(), inflight: None, flushed_tx, flushed_rx }
    }

    /// Whether `trial`'s results are stored but not yet decided on.
    fn holds(&self, trial: &str) -> bool {
        self.reports.iter().chain(self.inflight.iter().flat_map(|b| &b.reports)).any(|p| p.result.trial_id == trial)
    }
}

struct Running {
    record: TrialRecord,
    /// `<experiment>/trials/<id>`.
    dir: Arc<std::path::Path>,
    handle: TrialHandle,
    /// Held until every process of the trial is gone.
    allocation: Allocation,
    /// When this run started, on the runner's clock (seconds).
    started: f64,
    /// When it last reported, on the runner's clock.
    last_report: f64,
    /// Set when this run must end; the reason decides the final state.
    ending: Option<Ending>,
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
    Exploit(Box<Exploit>),
    /// The scheduler paused it: PAUSED, resumed from its checkpoint when
    /// the scheduler picks it.
    Paused,
    /// The trial broke a rule (e.g. no metric): ERROR with this message.
    Failed(String),
    /// No report within the hang timeout: killed, and a failure like a
    /// rank's death (restarted while `max_failures` allows).
    Hung(String),
}

/// A trial prepared off the loop before it (re)starts: its uncommitted
/// checkpoints removed (after a failed run), its checkpoint fetched from an
/// object store; and how that went (the fetched copy's local directory).
struct Restored {
    record: TrialRecord,
    allocation: Allocation,
    fetched: Result<Option<PathBuf>, String>,
    /// An exploit's donor checkpoint (pinned), and the recipient's copy of it
    /// when the copy succeeded.
    exploit: Option<(CheckpointRecord, Option<CheckpointRecord>)>,
}

/// Everything the loop needs, built by the Tuner.
pub(crate) struct Runner {
    pub exp_dir: PathBuf,
    pub store: Store,
    pub backend: Arc<dyn Backend>,
    pub searcher: Box<dyn Searcher>,
    pub scheduler: Box<dyn Scheduler>,
    pub stopper: Box<dyn Stopper>,
    /// The `[stop]` thresholds alone: an exploit never restarts a trial
    /// from a checkpoint that already meets them.
    pub stop_thresholds: schedulers::MetricThresholds,
    pub metric: Option<String>,
    pub max_concurrent: usize,
    pub max_trials: u64,
    pub time_budget: Option<Duration>,
    pub fail_fast: bool,
    /// Trials to (re)start before asking the searcher, oldest first.
    pub pending: VecDeque<TrialRecord>,
    /// Index of the next trial to create.
    pub next_index: u64,
    pub progress: Progress,
    /// Trials TERMINATED and ERROR so far (including before a resume).
    pub finished: (u64, u64),
    /// The node's resources; a trial starts only with all its bundles.
    pub pool: ResourcePool,
    /// What each trial asks for.
    pub request: Request,
    /// Trials started while earlier ends were not yet shown; shown after them.
    pub deferred_starts: Vec<TrialRecord>,
    /// The experiment's checkpoint storage: `<storage>/<name>`.
    pub storage: Storage,
    /// Which checkpoints to keep; where workers may save them.
    pub checkpoint: CheckpointConfig,
    /// Restarts after failures; hang detection.
    pub failure: FailureConfig,
    /// Commit markers and deletions under way, per trial; the sweep ends
    /// after them.
    pub background: Background,
    /// Set once no new trial may start (Ctrl-C, time budget, fail_fast).
    pub stopping: bool,
    /// The first trial error, for fail_fast's message.
    pub first_error: Option<String>,
    /// Trials whose last run failed: their storage may hold a checkpoint
    /// half written, removed before they run again.
    pub dirty: HashSet<String>,
    /// PAUSED trials, oldest first: the scheduler picks which resumes.
    pub paused: Vec<TrialRecord>,
    /// The scheduler was told no more trials will come.
    pub told_no_more: bool,
    /// The scheduler state last written to the store.
    pub saved_scheduler: String,
    /// For each live trial, how many of its results the scheduler has seen:
    /// saved with its state, so a resume replays only the rest.
    pub seen: HashMap<String, u64>,
    /// The clock's origin (the backend's virtual clock replaces it).
    pub origin: Instant,
    /// Unix time at `origin`.
    pub unix_origin: f64,
    /// The backend keeps a virtual clock (a simulation); fixed for the sweep.
    pub simulated: bool,
    /// Donor checkpoints being copied, kept from `num_to_keep` until done.
    pub pinned: HashMap<String, usize>,
}

/// How the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// Every trial ran (or the budget or fail_fast ended the sweep).
    Done,
    /// Ctrl-C.
    Interrupted,
}

impl Runner {
    pub(crate) async fn run(mut self) -> Result<Finish, TuneError> {
        let (events_tx, mut events) = mpsc::unbounded_channel::<Event>();
        // A simulation's results are recomputed, not irreplaceable: made durable at its end only.
        let flusher = Flusher::spawn(self.store.clone(), !self.simulated());
        let mut running: HashMap<String, Running> = HashMap::new();
        let mut searcher_done = false;
        let mut interrupts = 0u32;
        // Timers live across turns of the loop: re-creating them every turn
        // would re-register them with the timer driver each time.
        let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
        // A simulation's budget is virtual time, checked every turn instead.
        let wall_budget = self.time_budget.filter(|_| !self.simulated());
        let budget = tokio::time::sleep_until(wall_budget.map_or(far, |b| tokio::time::Instant::now() + b));
        tokio::pin!(budget);
        let ended_timer = tokio::time::sleep_until(far);
        tokio::pin!(ended_timer);
        // Results and ends waiting for a flush before anyone acts on them.
        let mut commits = Commits::new();
        let mut files: Vec<FileWrite> = Vec::new();
        let mut ended_deadline: Option<tokio::time::Instant> = None;
        let mut last_snapshot = String::new();
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let mut last_hang_check = Instant::now();
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(|source| TuneError::Io { path: PathBuf::from("<signal handler>"), source })?;
        let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|source| TuneError::Io { path: PathBuf::from("<signal handler>"), source })?;
        // Trials waiting for their checkpoint to arrive from an object store.
        let (restored_tx, mut restored_rx) = mpsc::unbounded_channel::<Restored>();
        let mut restoring: usize = 0;

        self.tell_capacity();
        loop {
            // Admit trials while there are free slots and resources for all of a trial's bundles.
            self.apply_stopped(&mut running, &mut commits.ended)?;
            if !self.stopping && self.simulated() && self.time_budget.is_some_and(|b| self.clock() >= b.as_secs_f64()) {
                self.out_of_time(&mut running);
            }
            while !self.stopping && running.len() + restoring < self.max_concurrent {
                let Some(allocation) = self.pool.try_allocate(&self.request) else { break };
                let can_add = !searcher_done && self.next_index < self.max_trials;
                let mut next = self.pending.pop_front();
                if next.is_none() {
                    next = self.resume_paused(can_add);
                }
                if next.is_none() && can_add {
                    let id = trial_id(self.next_index);
                    match self.searcher.suggest(&id) {
                        Suggestion::Config(config) => {
                            let record = TrialRecord::new(id, self.next_index, config, self.unix_now());
                            self.next_index += 1;
                            self.store.create_trial(&record, &self.searcher.save())?;
                            let view = view(&record);
                            self.scheduler.on_trial_add(&view);
                            if !self.simulated() {
                                self.save_scheduler()?;
                            }
                            // A simulation writes no per-trial files: thousands of tiny files would cost it more than its trials.
                            if !self.simulated() {
                                files.push(FileWrite::Params { trial_dir: self.trial_dir(&record.id), config: record.config.clone() });
                            }
                            next = Some(record);
                        }
                        Suggestion::Wait => {}
                        Suggestion::Finished => searcher_done = true,
                    }
                } else if next.is_none() {
                    searcher_done = true;
                }
                if next.is_none() && searcher_done && !self.told_no_more {
                    self.told_no_more = true;
                    self.scheduler.on_no_more_trials();
                    self.apply_stopped(&mut running, &mut commits.ended)?;
                }
                if next.is_none() {
                    next = self.resume_paused(false);
                }
                let Some(record) = next else {
                    self.pool.release(&allocation);
                    break;
                };
                // A trial whose number of workers was changed needs its own bundles.
                let request = self.request_for(&record);
                let allocation = if request == self.request {
                    allocation
                } else {
                    self.pool.release(&allocation);
                    match self.pool.try_allocate(&request) {
                        Some(a) => a,
                        None => {
                            // It waits, first in line, for workers to free up.
                            self.pending.push_front(record);
                            break;
                        }
                    }
                };
                // A start is shown after the ends not yet shown (they wait to be durable).
                let ends_pending = !commits.ended.is_empty() || commits.inflight.as_ref().is_some_and(|b| !b.ended.is_empty());
                let mut record = record;
                let exploit = self.prepare_exploit(&mut record)?;
                let check = if exploit.is_some() { Ok(None) } else { self.checkpoint_to_fetch(&record) };
                match check {
                    Err(msg) => {
                        self.pool.release(&allocation);
                        self.give_up(record, msg, &mut commits.ended, &mut running)?;
                    }
                    Ok(fetch) if fetch.is_some() || exploit.is_some() || self.dirty.contains(&record.id) => {
                        // Prepared off the loop, launched when ready: the failed run's
                        // leftovers removed, an exploit's checkpoint copied from its
                        // donor, the checkpoint fetched from an object store.
                        restoring += 1;
                        let tx = restored_tx.clone();
                        let cleanup = self.dirty.remove(&record.id).then(|| self.cleanup(&record.id)).transpose()?;
                        let (storage, scratch) = (self.storage.clone(), self.trial_dir(&record.id).join("restore"));
                        let trial_storage = self.storage.join(&format!("trials/{}", record.id));
                        let settled = self.background.settled(&record.id);
                        tokio::spawn(async move {
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
                                        storage.delete_checkpoint(uri).await.map_err(|e| e.to_string())?;
                                    }
                                    let uri = storage
                                        .copy_checkpoint(&job.donor.uri, &trial_storage)
                                        .await
                                        .map_err(|e| format!("could not copy its donor's checkpoint {}: {e}", job.donor.uri))?;
                                    copied = Some(CheckpointRecord { uri: uri.clone(), ..job.donor.clone() });
                                    fetch = (!storage.is_local()).then_some(uri);
                                }
                                match fetch {
                                    Some(uri) => storage.fetch_checkpoint(&uri, &scratch).await.map(Some).map_err(|e| e.to_string()),
                                    None => Ok(None),
                                }
                            }
                            .await;
                            let exploit = exploit.map(|job| (job.donor, copied));
                            let _ = tx.send(Restored { record, allocation, fetched, exploit });
                        });
                    }
                    Ok(_) => {
                        let local = self.local_checkpoint(&record);
                        self.launch(record, allocation, local, &events_tx, &mut running, &mut commits.ended, ends_pending)?;
                    }
                }
            }
            // Group commit for the burst just handled; after admitting, so a
            // freed slot is refilled without waiting for the flush.
            self.start_flush(&flusher, &mut commits, false);
            flusher.write_files(std::mem::take(&mut files));
            // A trial's end rides on the next flush for results, or gets its
            // own within END_FLUSH_DELAY.
            if commits.ended.is_empty() {
                ended_deadline = None;
            } else if ended_deadline.is_none() {
                let at = tokio::time::Instant::now() + END_FLUSH_DELAY;
                ended_deadline = Some(at);
                ended_timer.as_mut().reset(at);
            }
            if running.is_empty() && restoring == 0 && !self.stopping && !self.paused.is_empty() && !self.told_no_more {
                // Nothing runs and nothing new starts: the scheduler decides with what it has.
                self.told_no_more = true;
                self.scheduler.on_no_more_trials();
                continue;
            }
            if running.is_empty() && restoring == 0 && (self.stopping || (searcher_done && self.pending.is_empty())) {
                break;
            }
            if running.is_empty() && restoring == 0 {
                // The searcher waits on trials, yet none runs: it can never proceed.
                tracing::warn!("the searcher is waiting but no trial is running; ending the sweep");
                break;
            }

            if commits.inflight.is_none() && commits.reports.is_empty() && commits.ended.is_empty() && restoring == 0 {
                // A simulation's clock moves only once every event so far is acted on.
                self.backend.idle();
            }
            tokio::select! {
                biased;
                _ = async { tokio::select! { _ = sigint.recv() => {}, _ = sigterm.recv() => {} } } => {
                    interrupts += 1;
                    if interrupts == 1 {
                        self.progress.note("Interrupted: stopping running trials (Ctrl-C again to kill them)");
                        self.stopping = true;
                        for r in running.values_mut() {
                            r.ending = Some(Ending::Interrupted);
                            r.handle.stop(StopLevel::Graceful);
                        }
                    } else {
                        self.progress.note("Killing running trials");
                        for (_, mut r) in running.drain() {
                            r.handle.stop(StopLevel::Kill);
                            r.record.status = TrialStatus::Pending;
                            self.store.put_trial(&r.record)?;
                        }
                        // Trials still fetching their checkpoint were never started: they stay as stored.
                        self.commit_now(&flusher, &mut running, &mut commits).await?;
                        files.push(FileWrite::Remove { path: self.exp_dir.join(SNAPSHOT) });
                        flusher.write_files(std::mem::take(&mut files));
                        flusher.close().await;
                        self.progress.finish();
                        return Ok(Finish::Interrupted);
                    }
                }
                _ = &mut budget, if !self.stopping && wall_budget.is_some() => self.out_of_time(&mut running),
                Some(Restored { mut record, allocation, fetched, exploit }) = restored_rx.recv() => {
                    restoring -= 1;
                    let mut fetched = fetched;
                    let mut dropped = false;
                    if let Some((donor, copy)) = exploit {
                        let donor_trial = record.pending_exploit.as_ref().map(|e| e.donor.clone()).unwrap_or_default();
                        match (&fetched, copy) {
                            _ if self.stopping => {}
                            (Ok(_), Some(copy)) => {
                                let (uri, iteration) = (copy.uri.clone(), copy.iteration);
                                let e = self.finish_exploit(&mut record, &donor, copy)?;
                                if self.simulated() {
                                    self.apply_retention(&record.id)?;
                                } else {
                                    // The copy is a committed checkpoint like any other: durable, then marked.
                                    self.store.flush()?;
                                    self.after_commit(&record.id, &uri, iteration)?;
                                    files.push(FileWrite::Params { trial_dir: self.trial_dir(&record.id), config: e.config });
                                }
                            }
                            (Err(msg), None) => {
                                // The copy failed: no exploit, and no failure either; it goes on from its own checkpoint.
                                self.progress.note(&format!("{} does not exploit {donor_trial}: {msg}", record.id));
                                record.pending_exploit = None;
                                dropped = true;
                            }
                            (Ok(_), None) => fetched = Err("its exploit's copy went missing".into()),
                            (Err(_), Some(_)) => {}
                        }
                        self.unpin(&donor_trial, &donor.uri)?;
                    }
                    match fetched {
                        _ if dropped => {
                            self.pool.release(&allocation);
                            self.store.put_trial(&record)?;
                            // What the copy left half done goes before it runs.
                            self.dirty.insert(record.id.clone());
                            self.pending.push_front(record);
                        }
                        _ if self.stopping => {
                            // Never started: it stays as stored, resumed later.
                            self.pool.release(&allocation);
                        }
                        Ok(fetched) => {
                            let ends_pending = !commits.ended.is_empty() || commits.inflight.as_ref().is_some_and(|b| !b.ended.is_empty());
                            let local = fetched.or_else(|| self.local_checkpoint(&record));
                            self.launch(record, allocation, local, &events_tx, &mut running, &mut commits.ended, ends_pending)?;
                        }
                        Err(msg) => {
                            self.pool.release(&allocation);
                            let msg = format!("could not prepare its restart: {msg}");
                            self.failed_run(record, msg, &mut commits.ended, &mut running)?;
                        }
                    }
                }
                // Not while a flush is under way: its end starts the next one.
                Some(flushed) = commits.flushed_rx.recv() => {
                    if let Some(batch) = commits.inflight.take() {
                        self.finish_flush(&mut running, batch, flushed)?;
                    }
                    self.start_flush(&flusher, &mut commits, false);
                }
                // Not while a flush is under way (its end starts the next one): a
                // ready timer would otherwise win every turn of this biased select.
                _ = &mut ended_timer, if ended_deadline.is_some() && commits.inflight.is_none() => {
                    self.start_flush(&flusher, &mut commits, true);
                }
                ev = events.recv() => {
                    let Some(ev) = ev else { break };
                    let mut next = Some(ev);
                    while let Some(ev) = next {
                        match ev.kind {
                            EventKind::Report { report, reply } => match running.get_mut(&ev.trial_id) {
                                Some(r) => {
                                    let result = self.store_report(r, report, &mut files)?;
                                    commits.reports.push(Stored { result, reply });
                                }
                                None => reply.send(Directive::Stop),
                            },
                            EventKind::Exited(outcome) => {
                                // A trial's own results are decided on before its end.
                                if commits.holds(&ev.trial_id) {
                                    self.commit_now(&flusher, &mut running, &mut commits).await?;
                                }
                                self.on_exit(&ev.trial_id, outcome, &mut running, &mut commits.ended)?;
                            }
                        }
                        next = events.try_recv().ok();
                    }
                    // Under a steady stream of events the tick below may not get a turn.
                    if last_hang_check.elapsed() >= Duration::from_millis(500) {
                        last_hang_check = Instant::now();
                        self.detect_hangs(&mut running);
                    }
                }
                _ = tick.tick() => {
                    last_hang_check = Instant::now();
                    self.detect_hangs(&mut running);
                    self.progress.refresh(running.values().map(|r| &r.record));
                    let snapshot = self.snapshot(&running);
                    if snapshot != last_snapshot {
                        files.push(FileWrite::Snapshot { path: self.exp_dir.join(SNAPSHOT), json: snapshot.clone() });
                        last_snapshot = snapshot;
                    }
                }
            }
        }
        if interrupts == 0 && !self.stopping {
            // Nothing will resume them: the scheduler left them behind.
            for rec in std::mem::take(&mut self.paused) {
                self.scheduler.on_trial_complete(&view(&rec), rec.last_result.as_ref());
                self.terminate_paused(rec, &mut commits.ended)?;
            }
        }
        self.saved_scheduler.clear();
        self.save_scheduler()?;
        self.commit_now(&flusher, &mut running, &mut commits).await?;
        // A simulation syncs here only (a real sweep synced every batch already).
        self.store.flush()?;
        self.background.drain().await;
        files.push(FileWrite::Remove { path: self.exp_dir.join(SNAPSHOT) });
        flusher.write_files(std::mem::take(&mut files));
        flusher.close().await;
        self.progress.finish();
        if interrupts > 0 {
            return Ok(Finish::Interrupted);
        }
        if let (true, Some(e)) = (self.fail_fast, self.first_error.take()) {
            return Err(TuneError::FailFast(e));
        }
        Ok(Finish::Done)
    }

    /// The time budget is spent: no new trial starts, the running ones stop.
    fn out_of_time(&mut self, running: &mut HashMap<String, Running>) {
        self.progress.note("Time budget reached: stopping running trials");
        self.stopping = true;
        for r in running.values_mut() {
            r.ending.get_or_insert(Ending::Stopped);
            r.handle.stop(StopLevel::Graceful);
        }
    }

    /// Seconds on the runner's clock: the wall clock since the sweep
    /// started, or a simulation's virtual clock.
    fn clock(&self) -> f64 {
        self.backend.virtual_now().unwrap_or_else(|| self.origin.elapsed().as_secs_f64())
    }

    /// Unix time now (virtual in a simulation: its start plus its clock).
    fn unix_now(&self) -> f64 {
        match self.backend.virtual_now() {
            Some(v) => self.unix_origin + v,
            None => now_unix(),
        }
    }

    fn simulated(&self) -> bool {
        self.simulated
    }

    fn trial_dir(&self, id: &str) -> PathBuf {
        self.exp_dir.join("trials").join(id)
    }

    /// The live view `nestor status` shows while this sweep holds the store.
    fn snapshot(&self, running: &HashMap<String, Running>) -> String {
        let mut rows: Vec<&TrialRecord> = running.values().map(|r| &r.record).collect();
        rows.sort_by_key(|r| r.index);
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "trial_id": r.id,
                    "iteration": r.last_result.as_ref().map_or(0, |l| l.training_iteration),
                    "metrics": r.last_result.as_ref().map(|l| crate::cli::metrics_json(&l.metrics)),
                    "config": r.config,
                })
            })
            .collect();
        serde_json::json!({
            "version": 1,
            "pid": std::process::id(),
            "metric": self.metric,
            "trials": self.next_index,
            "terminated": self.finished.0,
            "error": self.finished.1,
            "running": rows,
        })
        .to_string()
    }

    fn show_ended(&mut self, ended: &mut Vec<TrialRecord>) {
        for r in ended.drain(..) {
            match r.status {
                TrialStatus::Terminated => self.finished.0 += 1,
                TrialStatus::Error => self.finished.1 += 1,
                _ => {}
            }
            self.progress.trial_ended(&r);
        }
        for r in std::mem::take(&mut self.deferred_starts) {
            self.progress.trial_started(&r);
        }
    }

    /// What `record` asks for: the experiment's request, with as many
    /// workers as a resource-changing scheduler gave it.
    pub(super) fn request_for(&self, record: &TrialRecord) -> Request {
        match record.num_workers {
            Some(n) if n as usize != self.request.workers.len() => {
                let worker = self.request.workers.first().cloned().unwrap_or_default();
                Request { workers: vec![worker; n.max(1) as usize], ..self.request.clone() }
            }
            _ => self.request.clone(),
        }
    }

    /// Tells the scheduler how many workers of the experiment's size the node holds.
    pub(super) fn tell_capacity(&mut self) {
        let one = Request { workers: self.request.workers.iter().take(1).cloned().collect(), ..self.request.clone() };
        let mut probe = self.pool.clone();
        let mut workers = 0u32;
        // Each trial's trainer share is counted once per worker here: a lower bound.
        while workers < 100_000 && probe.try_allocate(&one).is_some() {
            workers += 1;
        }
        let trial_workers = self.request.workers.len().max(1) as u32;
        self.scheduler.on_capacity(Capacity { workers: workers.max(trial_workers), trial_workers });
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        mut record: TrialRecord,
        allocation: Allocation,
        checkpoint: Option<PathBuf>,
        events: &mpsc::UnboundedSender<Event>,
        running: &mut HashMap<String, Running>,
        ended: &mut Vec<TrialRecord>,
        ends_pending: bool,
    ) -> Result<(), TuneError> {
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
        if record.status == TrialStatus::Paused {
            record.resumes += 1;
        }
        record.status = TrialStatus::Running;
        record.started_at = Some(self.unix_now());
        record.resources = allocation.workers.clone();
        let spec = LaunchSpec {
            trial_id: record.id.clone(),
            config: record.config.clone(),
            trial_dir: self.trial_dir(&record.id),
            checkpoint,
            start_iteration: record.latest_checkpoint.as_ref().map_or(0, |c| c.iteration),
            checkpoint_frequency: self.checkpoint.frequency.unwrap_or(0),
            workers: allocation.workers.clone(),
            storage: self.storage.join(&format!("trials/{}", record.id)),
            checkpoint_roots: self.checkpoint.allowed_dirs.clone(),
        };
        match self.backend.launch(spec, events.clone()) {
            Ok(handle) => {
                self.store.put_trial(&record)?;
                if ends_pending {
                    self.deferred_starts.push(record.clone());
                } else {
                    self.progress.trial_started(&record);
                }
                let now = self.clock();
                let dir = Arc::from(self.trial_dir(&record.id));
                running
                    .insert(record.id.clone(), Running { record, dir, handle, allocation, started: now, last_report: now, ending: None });
            }
            Err(e) => {
                self.pool.release(&allocation);
                // The trial could not start: it is an error, the sweep goes on.
                record.status = TrialStatus::Error;
                record.error = Some(e.to_string());
                record.ended_at = Some(self.unix_now());
                self.store.put_trial(&record)?;
                self.scheduler.on_trial_error(&view(&record));
                self.searcher.on_trial_complete(&record.id, None, true);
                ended.push(record);
            }
        }
        Ok(())
    }

    /// Starts flushing what is stored so far (off the loop), unless a flush is
    /// under way; trial ends ride along. `force` flushes for ended trials
    /// alone too.
    fn start_flush(&self, flusher: &Flusher, c: &mut Commits, force: bool) {
        // A simulation has no workers waiting: everything is acted on at once.
        let ends_only = (force || self.simulated()) && !c.ended.is_empty();
        if c.inflight.is_some() || (c.reports.is_empty() && !ends_only) {
            return;
        }
        c.inflight = Some(Batch { reports: std::mem::take(&mut c.reports), ended: std::mem::take(&mut c.ended) });
        if self.simulated() || c.inflight.as_ref().is_some_and(|b| b.reports.len() <= INLINE_FLUSH) {
            // A small batch: a flush right here answers sooner than a hand-off to another thread.
            let _ = c.flushed_tx.send(flusher.make_durable());
        } else {
            flusher.make_durable_in_background(c.flushed_tx.clone());
        }
    }

    /// A batch is durable: the scheduler, stoppers and searcher see each of its
    /// results, and the workers get their answers.
    fn finish_flush(
        &mut self,
        running: &mut HashMap<String, Running>,
        mut batch: Batch,
        flushed: Result<(), StoreError>,
    ) -> Result<(), TuneError> {
        // On failure the waiting workers' answers are dropped, which they
        // read as Stop: nothing not durable is ever acknowledged.
        flushed?;
        self.show_ended(&mut batch.ended);
        let mut committed = Vec::new();
        for Stored { result, reply } in batch.reports {
            let directive = match running.get_mut(&result.trial_id) {
                Some(r) => self.decide(r, &result),
                None => Directive::Stop,
            };
            reply.send(directive);
            if let Some(uri) = &result.checkpoint {
                committed.push((result.trial_id.clone(), uri.clone(), result.training_iteration));
            }
        }
        if !self.simulated() {
            for (trial, uri, iteration) in committed {
                self.after_commit(&trial, &uri, iteration)?;
            }
            self.save_scheduler()?;
        }
        Ok(())
    }

    /// Makes everything stored so far durable and acts on it, now.
    async fn commit_now(&mut self, flusher: &Flusher, running: &mut HashMap<String, Running>, c: &mut Commits) -> Result<(), TuneError> {
        if let Some(batch) = c.inflight.take() {
            let flushed = c.flushed_rx.recv().await.unwrap_or(Ok(()));
            self.finish_flush(running, batch, flushed)?;
        }
        if !c.reports.is_empty() || !c.ended.is_empty() {
            let batch = Batch { reports: std::mem::take(&mut c.reports), ended: std::mem::take(&mut c.ended) };
            let flushed = flusher.make_durable();
            self.finish_flush(running, batch, flushed)?;
        }
        Ok(())
    }

    fn on_exit(
        &mut self,
        trial_id: &str,
        outcome: ExitOutcome,
        running: &mut HashMap<String, Running>,
        ended: &mut Vec<TrialRecord>,
    ) -> Result<(), TuneError> {
        let Some(mut r) = running.remove(trial_id) else { return Ok(()) };
        // The backend reports an exit only once every process is gone.
        self.pool.release(&r.allocation);
        r.record.time_total_s += (self.clock() - r.started).max(0.0);
        let mut rec = r.record;
        match (r.ending.take(), outcome) {
            (Some(Ending::Interrupted), _) => {
                rec.status = TrialStatus::Pending;
                self.store.put_trial(&rec)?;
                ended.push(rec);
            }
            (Some(Ending::Paused), ExitOutcome::Completed | ExitOutcome::Stopped) => {
                rec.status = TrialStatus::Paused;
                self.store.put_trial(&rec)?;
                self.searcher.on_trial_pause(&rec.id);
                let at = self.paused.partition_point(|p| p.index < rec.index);
                self.paused.insert(at, rec.clone());
                ended.push(rec);
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
                self.progress.note(&format!("{} restarts with {n} worker(s) (was {was}) from {from}", rec.id));
                self.pending.push_front(rec);
            }
            (Some(Ending::Exploit(e)), ExitOutcome::Completed | ExitOutcome::Stopped) => {
                // Carried out before it runs again (first in line), also after a crash.
                rec.status = TrialStatus::Pending;
                rec.pending_exploit = Some(*e);
                self.store.put_trial(&rec)?;
                self.pending.push_front(rec);
            }
            (Some(Ending::Failed(msg)), _) | (Some(Ending::Stopped), ExitOutcome::Failed(msg)) => {
                self.give_up(rec, msg, ended, running)?;
            }
            (Some(Ending::Hung(msg)), _)
            | (None | Some(Ending::Paused | Ending::Exploit(_) | Ending::Resize(_)), ExitOutcome::Failed(msg)) => {
                self.failed_run(rec, msg, ended, running)?;
            }
            (_, ExitOutcome::Completed | ExitOutcome::Stopped) => {
                rec.status = TrialStatus::Terminated;
                rec.error = None;
                rec.ended_at = Some(self.unix_now());
                self.store.put_trial(&rec)?;
                self.scheduler.on_trial_complete(&view(&rec), rec.last_result.as_ref());
                self.searcher.on_trial_complete(&rec.id, rec.last_result.as_ref(), false);
                self.seen.remove(&rec.id);
                // What the searcher learnt from it survives a crash (it is durable with the trial's end).
                if !self.simulated() {
                    self.store.put_meta("searcher", &self.searcher.save())?;
                }
                ended.push(rec);
            }
        }
        Ok(())
    }

    /// Stores one report as a result (not yet durable) and returns it.
    fn store_report(&mut self, r: &mut Running, report: Report, files: &mut Vec<FileWrite>) -> Result<Arc<TrialResult>, TuneError> {
        let (now, unix) = (self.clock(), self.unix_now());
        let rec = &mut r.record;
        let mut metrics: Metrics = report.metrics;
        metrics.insert("time_this_iter_s".into(), (now - r.last_report).max(0.0));
        metrics.insert("time_total_s".into(), rec.time_total_s + (now - r.started).max(0.0));
        metrics.insert("timestamp".into(), unix);
        metrics.insert("training_iteration".into(), report.training_iteration as f64);
        r.last_report = now;
        let result = TrialResult {
            trial_id: rec.id.clone(),
            seq: rec.num_results,
            training_iteration: report.training_iteration,
            metrics,
            checkpoint: report.checkpoint.as_ref().map(|c| c.uri.clone()),
        };
        // Durable before anyone acts on it: stored here, flushed by `commit`.
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
        let result = Arc::new(result);
        if !self.simulated() {
            files.push(FileWrite::Result { trial_dir: Arc::clone(&r.dir), result: Arc::clone(&result) });
        }
        Ok(result)
    }

    /// What a durable result means for its trial.
    fn decide(&mut self, r: &mut Running, result: &TrialResult) -> Directive {
        if let Some(metric) = &self.metric {
            if !result.metrics.contains_key(metric) {
                let reported: Vec<&str> = result.metrics.keys().map(String::as_str).collect();
                let msg = format!("trial reported no `{metric}` (the experiment's metric); it reported: {}", reported.join(", "));
                r.ending = Some(Ending::Failed(msg));
                r.handle.stop(StopLevel::Graceful);
                return Directive::Stop;
            }
        }
        for (setting, name) in self.scheduler.required_metrics() {
            if result.metric(&name).is_none() {
                let reported: Vec<&str> = result.metrics.keys().map(String::as_str).collect();
                let msg = format!("trial reported no `{name}` ({setting}); it reported: {}", reported.join(", "));
                r.ending = Some(Ending::Failed(msg));
                r.handle.stop(StopLevel::Graceful);
                return Directive::Stop;
            }
        }
        let v = view(&r.record);
        let decision = self.scheduler.on_trial_result(&v, result);
        let mut exploit = None;
        for e in self.scheduler.take_exploits() {
            if e.trial_id == r.record.id {
                exploit = Some(e);
            } else {
                tracing::warn!(trial = %e.trial_id, "ignoring an exploit decided on another trial's result");
            }
        }
        let mut resize = None;
        let resizes = self.scheduler.take_resizes();
        // A Pause that only asked for a resize that cannot happen: the trial goes on.
        let had_resize = resizes.iter().any(|z| z.trial_id == r.record.id);
        for z in resizes {
            if z.trial_id != r.record.id {
                tracing::warn!(trial = %z.trial_id, "ignoring a resize decided on another trial's result");
                continue;
            }
            // Only from a checkpoint that the new number of workers can restore.
            match r.record.latest_checkpoint.as_ref().filter(|c| Some(&c.uri) == result.checkpoint.as_ref()) {
                Some(c) if c.required_world_size().is_none_or(|n| n == z.num_workers) => resize = Some(z.num_workers),
                Some(c) => {
                    tracing::warn!(trial = %z.trial_id, "not resizing: checkpoint {} holds the shards of {} ranks", c.uri, c.world_size)
                }
                None => tracing::warn!(trial = %z.trial_id, "not resizing: its result carried no committed checkpoint"),
            }
        }
        self.seen.insert(result.trial_id.clone(), result.seq + 1);
        let stop = self.stopper.should_stop_trial(&result.trial_id, result);
        self.searcher.on_trial_result(&result.trial_id, result);
        if r.ending.is_some() {
            return Directive::Stop;
        }
        if stop || decision == Decision::Stop {
            r.ending = Some(Ending::Stopped);
            return Directive::Stop;
        }
        if let Some(e) = exploit {
            r.ending = Some(Ending::Exploit(Box::new(e)));
            return Directive::Stop;
        }
        if let Some(n) = resize {
            r.ending = Some(Ending::Resize(n));
            return Directive::Stop;
        }
        if decision == Decision::Pause && !had_resize {
            r.ending = Some(Ending::Paused);
            return Directive::Stop;
        }
        Directive::Continue
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
