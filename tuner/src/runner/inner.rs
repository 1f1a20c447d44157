//! A trainer inside a trial (Ray Train V2's Tune pattern): once a trial's
//! function has booked its trainer's bundles, it asks for the trainer's run
//! (gRPC `RunTrainer`), and the loop launches that run's ranks through the
//! sweep's engine on those bundles, as the trial's own run. Its events come
//! here: each result goes back to the trial's process (which runs the
//! trainer's callbacks: `TuneReportCallback` reports it to the trial),
//! each checkpoint is committed and kept by the trainer's
//! `CheckpointConfig`, a failure restarts it from its latest checkpoint
//! while its `FailureConfig` allows. It stops when its trial is told to
//! end or its process goes; the trial's exit waits for it, so the bundles
//! are never given back while one of its ranks runs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use trainer::inner::{PreparedRun, TrainerUpdate};
use trainer::{Directive, Event, EventKind, ExitOutcome, LaunchSpec, Report, ResultFiles, ResultLine, StopLevel, TrialHandle};

use super::Runner;
use crate::config::CheckpointConfig;
use crate::store::CheckpointRecord;
use crate::TuneError;

/// A trainer's run inside a trial.
struct InnerRun {
    /// The trial whose function started it.
    parent: String,
    run: PreparedRun,
    /// Which checkpoints it keeps.
    retention: CheckpointConfig,
    updates: mpsc::UnboundedSender<TrainerUpdate>,
    /// The current launch's handle.
    handle: TrialHandle,
    /// Its committed checkpoints, oldest first.
    committed: Vec<CheckpointRecord>,
    /// Its latest checkpoint and iteration: where a restart starts.
    latest: Option<(String, u64)>,
    failures: u32,
    /// Told to stop: its trial is ending or its process is gone.
    stopping: bool,
    /// Results written to its `result.jsonl` so far.
    seq: u64,
    /// Its `result.jsonl` and `progress.csv`, opened by the first write.
    files: Arc<Mutex<Option<ResultFiles>>>,
}

/// The trainers running inside trials, by their run's id, and the exits
/// of trials that wait for theirs.
#[derive(Default)]
pub(super) struct InnerRuns {
    runs: HashMap<String, InnerRun>,
    /// A trial whose process exited while its trainer's ranks still ran:
    /// its exit is handled once they are gone too.
    deferred: HashMap<String, ExitOutcome>,
}

impl InnerRuns {
    /// Whether `id` is a trainer's run inside a trial.
    pub(super) fn owns(&self, id: &str) -> bool {
        self.runs.contains_key(id)
    }

    /// Whether a trainer's run of `trial` still runs.
    fn of_trial(&self, trial: &str) -> bool {
        self.runs.values().any(|r| r.parent == trial)
    }

    /// Ctrl-C twice: every trainer's ranks are killed.
    pub(super) fn kill_all(&mut self) {
        for r in self.runs.values_mut() {
            r.stopping = true;
            r.handle.stop(StopLevel::Kill);
        }
    }
}

/// The id a trainer's run of `trial` named `name` reports under.
fn inner_id(trial: &str, name: &str) -> String {
    format!("{trial}.train.{name}")
}

impl Runner {
    /// Trial `trial` asks for the trainer it booked to run.
    pub(super) fn on_run_trainer(
        &mut self,
        trial: &str,
        run: PreparedRun,
        updates: mpsc::UnboundedSender<TrainerUpdate>,
    ) -> Result<(), TuneError> {
        let failed = |why: String| {
            let _ = updates.send(TrainerUpdate::Ended { status: "failed".into(), error: Some(why), failures: 0 });
        };
        let Some(r) = self.trials.running.get(trial) else { return Ok(()) };
        if r.ending.is_some() {
            failed("the trial is ending".into());
            return Ok(());
        }
        if r.allocation.workers.is_empty() || self.trials.booking.waits(trial) {
            failed("the trial has not booked its trainer's resources (Book) first".into());
            return Ok(());
        }
        let id = inner_id(trial, &run.run.name);
        if self.inner.owns(&id) {
            failed(format!("the trial runs a trainer named {:?} already", run.run.name));
            return Ok(());
        }
        let retention = match run.run.checkpoint.clone().map(serde_json::from_value::<CheckpointConfig>).transpose() {
            Ok(c) => c.unwrap_or_default(),
            Err(e) => {
                failed(format!("the trainer's run: checkpoint: {e}"));
                return Ok(());
            }
        };
        let workers = r.allocation.workers.clone();
        let latest = run.latest.clone();
        let spec = self.inner_spec(&id, &run, workers, latest.as_ref());
        match self.backend.launch_inner(spec, &run.program, self.events_tx.clone()) {
            Ok(handle) => {
                tracing::info!(trial, run = %id, from = ?latest, "the trial's trainer starts");
                let inner = InnerRun {
                    parent: trial.to_string(),
                    run,
                    retention,
                    updates,
                    handle,
                    committed: Vec::new(),
                    latest,
                    failures: 0,
                    stopping: false,
                    seq: 0,
                    files: Arc::new(Mutex::new(None)),
                };
                self.inner.runs.insert(id, inner);
            }
            Err(e) => failed(format!("its trainer could not start: {e}")),
        }
        Ok(())
    }

    /// The launch of trainer run `id` on `workers`, from `from` when it has a checkpoint.
    fn inner_spec(&self, id: &str, run: &PreparedRun, workers: Vec<trainer::WorkerBundle>, from: Option<&(String, u64)>) -> LaunchSpec {
        let local = run.storage.is_local();
        LaunchSpec {
            trial_id: id.to_string(),
            config: run.run.config.clone(),
            trial_dir: run.run.dir.clone(),
            checkpoint: from.filter(|_| local).map(|(uri, _)| PathBuf::from(uri)),
            checkpoint_uri: from.filter(|_| !local).map(|(uri, _)| uri.clone()),
            start_iteration: from.map_or(0, |(_, i)| *i),
            checkpoint_frequency: 0,
            workers,
            storage: run.storage.clone(),
            checkpoint_roots: self.settings.checkpoint.allowed_dirs.clone(),
            datasets: None,
            await_decisions: true,
        }
    }

    /// An event of a trainer's run inside a trial.
    pub(super) fn on_inner_event(&mut self, ev: Event) -> Result<(), TuneError> {
        match ev.kind {
            EventKind::Report { report, reply } => self.on_inner_report(&ev.trial_id, report, reply),
            EventKind::Exited(outcome) => return self.on_inner_exit(&ev.trial_id, outcome),
            EventKind::NodeLost { node, why } => self.set_aside(&node, &why),
            EventKind::Book { reply, .. } => {
                let _ = reply.send(Err("a trainer's run inside a trial cannot book resources of its own".into()));
            }
            EventKind::RunTrainer { updates, .. } => {
                let error = Some("a trainer's run inside a trial cannot start another".to_string());
                let _ = updates.send(TrainerUpdate::Ended { status: "failed".into(), error, failures: 0 });
            }
            EventKind::Stuck => {}
        }
        Ok(())
    }

    /// A result of trainer run `id`: answered at once, sent to the trial's
    /// process, written to the run's `result.jsonl`; its checkpoint
    /// committed, then the result acknowledged.
    fn on_inner_report(&mut self, id: &str, report: Report, reply: trainer::Reply) {
        let Some(inner) = self.inner.runs.get_mut(id) else {
            drop(reply.send(Directive::Stop));
            return;
        };
        let now = self.clock.now();
        if let Some(parent) = self.trials.running.get_mut(&inner.parent) {
            // The trial is alive: its trainer reports.
            parent.last_report = now;
        }
        let directive = if inner.stopping { Directive::Stop } else { Directive::Continue };
        let ack = reply.send(directive);
        let checkpoint = report.checkpoint.as_ref().map(|c| c.uri.clone());
        let result = TrainerUpdate::Result {
            training_iteration: report.training_iteration,
            metrics: report.metrics.clone(),
            extra: report.extra.clone(),
            checkpoint: checkpoint.clone(),
            rank_metrics: report.rank_metrics.clone(),
        };
        let updates = inner.updates.clone();
        let seq = inner.seq;
        inner.seq += 1;
        let (files, dir, storage, trial) = (Arc::clone(&inner.files), inner.run.run.dir.clone(), inner.run.storage.clone(), id.to_string());
        let mut doomed = Vec::new();
        if let Some(c) = &report.checkpoint {
            inner.latest = Some((c.uri.clone(), report.training_iteration));
            inner.committed.push(CheckpointRecord {
                version: crate::store::RECORD_VERSION,
                iteration: report.training_iteration,
                uri: c.uri.clone(),
                ranks: c.ranks.clone(),
                world_size: c.world_size,
                metrics: report.metrics.clone().into_iter().collect(),
            });
            if let Some(keep) = inner.retention.num_to_keep {
                let r = &inner.retention;
                doomed = crate::retention::doomed(&inner.committed, keep, r.score_attribute.as_deref(), r.score_order);
                inner.committed.retain(|c| !doomed.iter().any(|d| d.iteration == c.iteration));
            }
        }
        // Off the loop, in order with this run's other file work.
        self.checkpoints.spawn(id, async move {
            let (iteration, line_trial, line_checkpoint) = (report.training_iteration, trial.clone(), checkpoint.clone());
            let written = tokio::task::spawn_blocking(move || {
                let mut metrics = report.metrics;
                metrics.insert("training_iteration".into(), iteration as f64);
                let line = ResultLine {
                    trial_id: &line_trial,
                    seq,
                    training_iteration: iteration,
                    metrics: &metrics,
                    checkpoint: line_checkpoint.as_deref(),
                    extra: report.extra.as_ref(),
                };
                let mut guard = files.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if guard.is_none() {
                    *guard = Some(ResultFiles::open(&dir, seq == 0)?);
                }
                let f = guard.as_mut().ok_or_else(|| std::io::Error::other("the result files are not open"))?;
                f.append(&line).and_then(|()| f.sync())
            })
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
            if let Err(e) = written {
                tracing::warn!(run = %trial, error = %e, "could not write the trainer's result");
                return; // never acknowledged
            }
            if let Some(uri) = &checkpoint {
                let marker = serde_json::json!({ "trial_id": trial, "training_iteration": iteration,
                                                 "committed_at": crate::clock::now_unix() });
                if let Err(e) = storage.mark_committed(uri, marker.to_string().into_bytes()).await {
                    tracing::warn!(checkpoint = %uri, error = %e, "could not write the commit marker");
                    return;
                }
            }
            ack.durable();
            // Durable now: the trial's process hears of it (its callbacks are told of durable results).
            let _ = updates.send(result);
            for c in doomed {
                if let Err(e) = storage.delete_checkpoint(&c.uri).await {
                    tracing::warn!(checkpoint = %c.uri, error = %e, "could not delete a checkpoint beyond num_to_keep");
                }
            }
        });
    }

    /// Trainer run `id` has exited: restarted from its latest checkpoint
    /// after a failure its `FailureConfig` allows, else over (and its
    /// trial's exit, if it came first, handled now).
    fn on_inner_exit(&mut self, id: &str, outcome: ExitOutcome) -> Result<(), TuneError> {
        let Some(mut inner) = self.inner.runs.remove(id) else { return Ok(()) };
        let parent_running = self.trials.running.get(&inner.parent).is_some_and(|p| p.ending.is_none());
        let restartable = !inner.stopping && parent_running && !self.inner.deferred.contains_key(&inner.parent);
        let failure = match &outcome {
            ExitOutcome::Failed(m) if restartable && inner.run.run.failure.may_restart(inner.failures) => Some(m.clone()),
            ExitOutcome::Infrastructure(m) if restartable && inner.run.run.failure.may_restart_after_infrastructure(inner.failures) => {
                Some(m.clone())
            }
            _ => None,
        };
        if let Some(failure) = failure {
            inner.failures += 1;
            let from = inner.latest.clone();
            let workers = self.trials.running.get(&inner.parent).map(|p| p.allocation.workers.clone()).unwrap_or_default();
            let spec = self.inner_spec(id, &inner.run, workers, from.as_ref());
            let first = failure.lines().next().unwrap_or_default().to_string();
            tracing::warn!(run = %id, failure = %first, "the trial's trainer failed; restarting from {:?}", from);
            self.tell(id, &inner.updates, TrainerUpdate::Restarted { failure, failures: inner.failures, from: from.map(|(u, _)| u) });
            // After this run's file work: its uncommitted checkpoint is not a restart's.
            match self.backend.launch_inner(spec, &inner.run.program, self.events_tx.clone()) {
                Ok(handle) => {
                    inner.handle = handle;
                    self.inner.runs.insert(id.to_string(), inner);
                    return Ok(());
                }
                Err(e) => {
                    let error = Some(format!("its trainer could not restart: {e}"));
                    self.tell(id, &inner.updates, TrainerUpdate::Ended { status: "failed".into(), error, failures: inner.failures });
                }
            }
        } else {
            let (status, error) = match outcome {
                ExitOutcome::Completed => ("completed", None),
                ExitOutcome::Stopped => ("stopped", None),
                ExitOutcome::Failed(m) | ExitOutcome::Infrastructure(m) if !inner.stopping => ("failed", Some(m)),
                // Stopped from outside, its ranks died of it.
                ExitOutcome::Failed(_) | ExitOutcome::Infrastructure(_) => ("stopped", None),
            };
            self.tell(id, &inner.updates, TrainerUpdate::Ended { status: status.into(), error, failures: inner.failures });
        }
        if !self.inner.of_trial(&inner.parent) {
            if let Some(outcome) = self.inner.deferred.remove(&inner.parent) {
                return self.on_exit(&inner.parent, outcome);
            }
        }
        Ok(())
    }

    /// Sends `update` to the trial's process after the results of run `id`
    /// still being written: it hears of them in order.
    fn tell(&mut self, id: &str, updates: &mpsc::UnboundedSender<TrainerUpdate>, update: TrainerUpdate) {
        let updates = updates.clone();
        self.checkpoints.spawn(id, async move {
            let _ = updates.send(update);
        });
    }

    /// Stops the trainers whose trial is ending, gone, or whose process
    /// closed its stream. Called after every event.
    pub(super) fn stop_orphaned_trainers(&mut self) {
        for inner in self.inner.runs.values_mut().filter(|r| !r.stopping) {
            let parent = self.trials.running.get(&inner.parent);
            if parent.is_none_or(|p| p.ending.is_some()) || inner.updates.is_closed() || self.inner.deferred.contains_key(&inner.parent) {
                tracing::info!(trial = %inner.parent, "stopping the trial's trainer");
                inner.stopping = true;
                inner.handle.stop(StopLevel::Graceful);
            }
        }
    }

    /// Trial `trial` has exited; true when its exit must wait for its
    /// trainer's ranks (then handled once they are gone).
    pub(super) fn defer_exit(&mut self, trial: &str, outcome: &ExitOutcome) -> bool {
        if !self.inner.of_trial(trial) {
            return false;
        }
        self.inner.deferred.insert(trial.to_string(), outcome.clone());
        self.stop_orphaned_trainers();
        true
    }
}
