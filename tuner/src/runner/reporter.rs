//! The loop's output. The loop tells its reporter what happened
//! ([`Output`]); the reporter turns that into the public [`Event`] stream
//! and hands each event, in order, to every consumer: the console
//! ([`Progress`]), the files for people ([`TrialFiles`]: `params.json`,
//! `result.jsonl`, `progress.csv`, `status.json`) and the callbacks, each
//! on a thread of its own ([`Isolated`]). The loop never writes to a
//! terminal or a file itself.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use schedulers::TrialStatus;
use search::{Mode, TrialResult};

use crate::callback::{Best, Callback, Event, ExperimentInfo, Isolated, RunningTrial, Status, StopReason, Summary, TrialFiles};
use crate::progress::Progress;
use crate::store::TrialRecord;

/// What the loop tells its reporter.
pub(crate) enum Output<'a> {
    /// One of the events that need nothing from the reporter but passing on.
    Event(Event),
    /// The sweep stops early.
    Stopping(StopReason, String),
    /// A message about the sweep. `after_ends`: ends not yet durable are shown first.
    Note { message: String, after_ends: bool },
    /// A run started. `after_ends`: ends not yet durable are shown first.
    /// `resumed`: a PAUSED trial resumes.
    Started { record: &'a TrialRecord, after_ends: bool, resumed: bool },
    /// A trial's run ended and that is durable: TERMINATED, ERROR, PAUSED,
    /// or PENDING again (the sweep stopped).
    Ended(&'a TrialRecord),
    /// Ends not yet durable are all shown: starts held back follow.
    EndsShown,
    /// A result, durable now; with `checkpoint`, its checkpoint is committed.
    Result { result: &'a Arc<TrialResult>, checkpoint: bool },
    /// Every half second: the running trials, oldest first, how many trials
    /// exist, and how many are paused and wait to (re)start.
    Tick { running: &'a [&'a TrialRecord], trials: u64, paused: usize, waiting: usize },
}

/// Owns the consumers of the sweep's events.
pub(crate) struct Reporter {
    info: Arc<ExperimentInfo>,
    progress: Progress,
    /// The files for people (not in a replay).
    files: Option<TrialFiles>,
    /// Taken at the end, when they close.
    callbacks: Option<Isolated>,
    /// Trials TERMINATED and ERROR so far (including before a resume).
    finished: (u64, u64),
    /// Those at the start of this session, for the pace.
    finished_at_start: u64,
    /// Starts held back until the ends before them are shown.
    deferred: Vec<(TrialRecord, bool)>,
    /// Messages held back until the ends before them are shown.
    deferred_notes: Vec<String>,
    best: Option<Best>,
    start: Instant,
    stopped_early: bool,
    trials: u64,
}

/// Which files for people a sweep writes (a replay writes none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FilesForPeople {
    /// Each trial's `params.json`, `result.jsonl` and `progress.csv`, and the experiment's.
    PerTrial,
    /// The experiment's alone: `events.jsonl`, `status.json` and every result in `results.jsonl`.
    Experiment,
}

impl Reporter {
    /// A reporter for the sweep `info`; `callbacks` run on threads of their
    /// own, each given `deadline` for one event. It tells them the sweep starts.
    pub(crate) fn new(
        info: ExperimentInfo,
        progress: Progress,
        files: Option<FilesForPeople>,
        finished: (u64, u64),
        callbacks: Vec<Box<dyn Callback>>,
        deadline: Duration,
    ) -> Self {
        let files = files.map(|f| TrialFiles::new(info.dir.clone(), f == FilesForPeople::PerTrial));
        let mut r = Self {
            info: Arc::new(info),
            progress,
            files,
            callbacks: Some(Isolated::start(callbacks, deadline)),
            finished,
            finished_at_start: finished.0 + finished.1,
            deferred: Vec::new(),
            deferred_notes: Vec::new(),
            best: None,
            start: Instant::now(),
            stopped_early: false,
            trials: 0,
        };
        r.emit(Event::ExperimentStarted(Arc::clone(&r.info)));
        r
    }

    /// Trials TERMINATED and ERROR so far.
    #[cfg(test)]
    pub(crate) fn finished(&self) -> (u64, u64) {
        self.finished
    }

    /// Hands `event` to every consumer, in order.
    fn emit(&mut self, event: Event) {
        if let Err(e) = self.progress.on_event(&event) {
            tracing::warn!(error = %e, "the console failed");
        }
        if let Some(files) = &mut self.files {
            if let Err(e) = files.on_event(&event) {
                tracing::warn!(error = %e, "could not queue a trial file");
            }
        }
        if let Some(callbacks) = self.callbacks.as_mut().filter(|c| !c.is_empty()) {
            callbacks.send(&Arc::new(event));
        }
    }

    fn start_shown(&mut self, record: TrialRecord, resumed: bool) {
        self.emit(Event::TrialStarted { trial: Arc::new(record), resumed });
    }

    /// Shows the held-back start of `trial_id`, if any: a trial's start comes
    /// before its results and its end.
    fn start_before(&mut self, trial_id: &str) {
        if let Some(at) = self.deferred.iter().position(|(r, _)| r.id == trial_id) {
            let (r, resumed) = self.deferred.remove(at);
            self.start_shown(r, resumed);
        }
    }

    /// Takes one event.
    pub(crate) fn report(&mut self, out: Output<'_>) {
        match out {
            Output::Event(event) => self.emit(event),
            Output::Stopping(reason, message) => {
                if matches!(reason, StopReason::Interrupted | StopReason::Killed | StopReason::DiskFull | StopReason::OutOfNodes) {
                    self.stopped_early = true;
                }
                self.emit(Event::Stopping { reason, message });
            }
            Output::Note { message, after_ends } => {
                if after_ends {
                    self.deferred_notes.push(message);
                } else {
                    self.emit(Event::Message(message));
                }
            }
            Output::Started { record, after_ends, resumed } => {
                if after_ends {
                    self.deferred.push((record.clone(), resumed));
                } else {
                    self.start_shown(record.clone(), resumed);
                }
            }
            Output::Ended(record) => {
                self.start_before(&record.id);
                let record = Arc::new(record.clone());
                let event = match record.status {
                    TrialStatus::Terminated => {
                        self.finished.0 += 1;
                        Event::TrialCompleted(record)
                    }
                    TrialStatus::Error => {
                        self.finished.1 += 1;
                        Event::TrialErrored(record)
                    }
                    TrialStatus::Paused => Event::TrialPaused(record),
                    _ => Event::TrialInterrupted(record),
                };
                self.emit(event);
            }
            Output::EndsShown => {
                for (r, resumed) in std::mem::take(&mut self.deferred) {
                    self.start_shown(r, resumed);
                }
                for message in std::mem::take(&mut self.deferred_notes) {
                    self.emit(Event::Message(message));
                }
            }
            Output::Result { result, checkpoint } => {
                self.start_before(&result.trial_id);
                self.note_best(result);
                self.emit(Event::Result(Arc::clone(result)));
                if let (true, Some(uri)) = (checkpoint, &result.checkpoint) {
                    let (trial_id, iteration, uri) = (result.trial_id.clone(), result.training_iteration, uri.clone());
                    self.emit(Event::CheckpointCommitted { trial_id, iteration, uri });
                }
            }
            Output::Tick { running, trials, paused, waiting } => {
                self.trials = trials;
                let status = self.status(running, trials, paused, waiting);
                self.emit(Event::Status(Arc::new(status)));
            }
        }
    }

    fn note_best(&mut self, result: &TrialResult) {
        let Some(metric) = &self.info.metric else { return };
        let mode = self.info.mode.unwrap_or_default();
        let Some(&value) = result.metrics.get(metric) else { return };
        if value.is_nan() {
            return;
        }
        let better = match &self.best {
            None => true,
            Some(b) => match mode {
                Mode::Min => value < b.value,
                Mode::Max => value > b.value,
            },
        };
        if better {
            self.best = Some(Best { trial_id: result.trial_id.clone(), value, iteration: result.training_iteration });
        }
    }

    /// Hands the files queued so far to the writer threads (once per turn of the loop).
    pub(crate) fn flush(&mut self) {
        if let Some(files) = &mut self.files {
            files.flush();
        }
    }

    /// The sweep is over: the last event goes out, every file is written,
    /// the callbacks close (waited for at most their deadline).
    pub(crate) async fn close(mut self) {
        let summary = Summary {
            terminated: self.finished.0,
            errored: self.finished.1,
            trials: self.trials,
            stopped_early: self.stopped_early,
            elapsed_s: self.start.elapsed().as_secs_f64(),
        };
        self.emit(Event::ExperimentEnded(Arc::new(summary)));
        if let Some(files) = self.files.take() {
            files.close().await;
        }
        if let Some(callbacks) = self.callbacks.take() {
            let _ = tokio::task::spawn_blocking(move || callbacks.close()).await;
        }
    }

    /// What `status.json` and the console show now.
    fn status(&self, running: &[&TrialRecord], trials: u64, paused: usize, waiting: usize) -> Status {
        let elapsed = self.start.elapsed().as_secs_f64();
        let done = self.finished.0 + self.finished.1;
        let planned = self.info.planned.max(trials);
        let pending = planned.saturating_sub(trials) + waiting as u64;
        Status {
            version: Status::VERSION,
            pid: std::process::id(),
            metric: self.info.metric.clone(),
            mode: self.info.mode,
            trials,
            planned,
            terminated: self.finished.0,
            error: self.finished.1,
            paused: paused as u64,
            pending,
            best: self.best.clone(),
            elapsed_s: elapsed,
            eta_s: eta(elapsed, done - self.finished_at_start, planned.saturating_sub(done), self.info.time_budget_s),
            running: running
                .iter()
                .map(|r| RunningTrial {
                    trial_id: r.id.clone(),
                    iteration: r.last_result.as_ref().map_or(0, |l| l.training_iteration),
                    metrics: r.last_result.as_ref().map(|l| search::metrics_serde::to_json(&l.metrics)),
                    config: r.config.clone(),
                    resources: r.resources.clone(),
                })
                .collect(),
        }
    }
}

/// Seconds left: the trials left at this session's pace (trials done per
/// second so far), capped by the time budget; none before a trial is done.
fn eta(elapsed: f64, done_here: u64, left: u64, budget: Option<f64>) -> Option<f64> {
    let by_pace = (done_here > 0 && elapsed > 0.0).then(|| left as f64 * elapsed / done_here as f64);
    let by_budget = budget.map(|b| (b - elapsed).max(0.0));
    match (by_pace, by_budget) {
        (Some(p), Some(b)) => Some(p.min(b)),
        (p, b) => p.or(b.filter(|_| left > 0)),
    }
}

/// The experiment as a sweep's events describe it.
pub(crate) fn experiment_info(exp_dir: PathBuf, file: &crate::ExperimentFile, planned: u64, resumed: bool) -> ExperimentInfo {
    let e = &file.experiment;
    ExperimentInfo {
        name: e.name.clone(),
        dir: exp_dir,
        metric: e.metric.clone(),
        mode: e.mode,
        planned,
        time_budget_s: e.time_budget_s,
        resumed,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Records each event's kind and trial.
    struct Record(Arc<std::sync::Mutex<Vec<String>>>);

    impl Callback for Record {
        fn on_event(&mut self, event: &Event) -> Result<(), crate::callback::CallbackError> {
            let trial = match event {
                Event::TrialStarted { trial, .. } => trial.id.clone(),
                Event::TrialErrored(t) | Event::TrialCompleted(t) => t.id.clone(),
                _ => return Ok(()),
            };
            self.0.lock().unwrap().push(format!("{} {trial}", event.kind()));
            Ok(())
        }
    }

    /// A restart held back behind the ends before it, whose run errors
    /// before those ends are shown: its start still comes before its end.
    #[tokio::test]
    async fn a_held_back_start_comes_before_its_trials_end() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let info = ExperimentInfo {
            name: "e".into(),
            dir: std::env::temp_dir(),
            metric: None,
            mode: None,
            planned: 2,
            time_budget_s: None,
            resumed: false,
        };
        let progress = Progress::new(crate::ProgressMode::Quiet, None);
        let mut r = Reporter::new(info, progress, None, (0, 0), vec![Box::new(Record(Arc::clone(&seen)))], Duration::from_secs(5));
        let (mut a, mut b) =
            (TrialRecord::new("a".into(), 0, serde_json::json!({}), 0.0), TrialRecord::new("b".into(), 1, serde_json::json!({}), 0.0));
        r.report(Output::Started { record: &a, after_ends: false, resumed: false });
        r.report(Output::Started { record: &b, after_ends: true, resumed: false });
        b.status = TrialStatus::Error;
        r.report(Output::Ended(&b));
        a.status = TrialStatus::Terminated;
        r.report(Output::Ended(&a));
        r.report(Output::EndsShown);
        r.close().await;
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen, ["trial_started a", "trial_started b", "trial_errored b", "trial_completed a"]);
    }

    #[test]
    fn the_eta_follows_the_pace_and_the_budget() {
        assert_eq!(eta(10.0, 0, 5, None), None);
        assert_eq!(eta(10.0, 2, 6, None), Some(30.0));
        assert_eq!(eta(10.0, 2, 6, Some(25.0)), Some(15.0));
        assert_eq!(eta(10.0, 0, 6, Some(25.0)), Some(15.0));
        assert_eq!(eta(10.0, 2, 0, None), Some(0.0));
    }
}
