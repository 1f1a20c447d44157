//! The loop's output: the live display, `status.json` and the files for
//! people under each trial's directory (`params.json`, `result.jsonl`,
//! `progress.csv`). The loop feeds it typed [`Output`] events and never
//! writes to a terminal or a file itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use schedulers::TrialStatus;
use search::TrialResult;

use crate::files::{FileWrite, FileWriter};
use crate::progress::Progress;
use crate::store::TrialRecord;

/// The live-status file in the experiment directory, present while a sweep runs.
pub(crate) const SNAPSHOT: &str = "status.json";

/// What the loop tells its reporter.
pub(crate) enum Output<'a> {
    /// A line for the person watching: a restart, an exploit, Ctrl-C.
    Note(&'a str),
    /// A trial's config, new or changed by an exploit: its `params.json`.
    Params { trial: &'a str, config: &'a serde_json::Value },
    /// A run started. `after_ends`: ends not yet durable are shown first.
    Started { record: &'a TrialRecord, after_ends: bool },
    /// A trial's run ended and that is durable: TERMINATED, ERROR, PAUSED,
    /// or PENDING again (Ctrl-C).
    Ended(&'a TrialRecord),
    /// Ends not yet durable are all shown: starts held back follow.
    EndsShown,
    /// A stored result of a running trial: its `result.jsonl` and `progress.csv` lines.
    Result(&'a Arc<TrialResult>),
    /// Every half second: the running trials, oldest first, and how many trials exist.
    Tick { running: &'a [&'a TrialRecord], trials: u64 },
}

/// Owns the display and the files for people.
pub(crate) struct Reporter {
    exp_dir: PathBuf,
    metric: Option<String>,
    /// Whether trial files and `status.json` are written (not in a replay).
    files: bool,
    progress: Progress,
    writer: FileWriter,
    queued: Vec<FileWrite>,
    /// Trials TERMINATED and ERROR so far (including before a resume).
    finished: (u64, u64),
    /// Starts held back until the ends before them are shown.
    deferred: Vec<TrialRecord>,
    last_snapshot: String,
}

impl Reporter {
    pub(crate) fn new(exp_dir: PathBuf, metric: Option<String>, progress: Progress, files: bool, finished: (u64, u64)) -> Self {
        Self {
            exp_dir,
            metric,
            files,
            progress,
            writer: FileWriter::spawn(),
            queued: Vec::new(),
            finished,
            deferred: Vec::new(),
            last_snapshot: String::new(),
        }
    }

    /// Trials TERMINATED and ERROR so far.
    #[cfg(test)]
    pub(crate) fn finished(&self) -> (u64, u64) {
        self.finished
    }

    fn trial_dir(&self, id: &str) -> PathBuf {
        self.exp_dir.join("trials").join(id)
    }

    /// Takes one event.
    pub(crate) fn report(&mut self, out: Output<'_>) {
        match out {
            Output::Note(text) => self.progress.note(text),
            Output::Params { trial, config } => {
                if self.files {
                    self.queued.push(FileWrite::Params { trial_dir: self.trial_dir(trial), config: config.clone() });
                }
            }
            Output::Started { record, after_ends } => {
                if after_ends {
                    self.deferred.push(record.clone());
                } else {
                    self.progress.trial_started(record);
                }
            }
            Output::Ended(record) => {
                match record.status {
                    TrialStatus::Terminated => self.finished.0 += 1,
                    TrialStatus::Error => self.finished.1 += 1,
                    _ => {}
                }
                self.progress.trial_ended(record);
            }
            Output::EndsShown => {
                for r in std::mem::take(&mut self.deferred) {
                    self.progress.trial_started(&r);
                }
            }
            Output::Result(result) => {
                if self.files {
                    let trial_dir: Arc<Path> = Arc::from(self.trial_dir(&result.trial_id));
                    self.queued.push(FileWrite::Result { trial_dir, result: Arc::clone(result) });
                }
            }
            Output::Tick { running, trials } => {
                self.progress.refresh(running.iter().copied());
                if self.files {
                    let snapshot = self.snapshot(running, trials);
                    if snapshot != self.last_snapshot {
                        self.queued.push(FileWrite::Snapshot { path: self.exp_dir.join(SNAPSHOT), json: snapshot.clone() });
                        self.last_snapshot = snapshot;
                    }
                }
            }
        }
    }

    /// Hands the files queued so far to the writer thread (once per turn of the loop).
    pub(crate) fn flush(&mut self) {
        self.writer.write(std::mem::take(&mut self.queued));
    }

    /// The sweep is over: `status.json` goes, every file is written, the display closes.
    pub(crate) async fn close(mut self) {
        if self.files {
            self.queued.push(FileWrite::Remove { path: self.exp_dir.join(SNAPSHOT) });
        }
        self.flush();
        self.writer.close().await;
        self.progress.finish();
    }

    /// The live view `nestor status` shows while this sweep holds the store.
    fn snapshot(&self, running: &[&TrialRecord], trials: u64) -> String {
        let rows: Vec<serde_json::Value> = running
            .iter()
            .map(|r| {
                serde_json::json!({
                    "trial_id": r.id,
                    "iteration": r.last_result.as_ref().map_or(0, |l| l.training_iteration),
                    "metrics": r.last_result.as_ref().map(|l| search::metrics_serde::to_json(&l.metrics)),
                    "config": r.config,
                    "resources": r.resources,
                })
            })
            .collect();
        serde_json::json!({
            "version": 1,
            "pid": std::process::id(),
            "metric": self.metric,
            "trials": trials,
            "terminated": self.finished.0,
            "error": self.finished.1,
            "running": rows,
        })
        .to_string()
    }
}
