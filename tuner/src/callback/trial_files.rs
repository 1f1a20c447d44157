//! The files for people as a consumer of the sweep's events.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Callback, CallbackError, Event, Status};
use crate::files::{FileWrite, FileWriter, EVENTS, RESULTS};

/// The files for people as a consumer of the sweep's events: `params.json`
/// when a trial starts or exploits, a line of `result.jsonl` and
/// `progress.csv` per durable result, a line of `events.jsonl` per other
/// event but the status ticks, `status.json` while the sweep runs (removed
/// at its end). Without per-trial files (`trial_files = false`: four file
/// creations a trial saved) every result is a line of the experiment's own
/// `results.jsonl` instead, so a live dashboard still follows the sweep.
/// Writes are queued and handed to the writer threads once per turn of the
/// loop ([`TrialFiles::flush`]).
pub(crate) struct TrialFiles {
    exp_dir: PathBuf,
    /// Each trial's own files; else the experiment's `results.jsonl`.
    per_trial: bool,
    /// Results not yet queued for `results.jsonl` (without per-trial
    /// files): their lines are made by the writer thread.
    results: Vec<Arc<search::TrialResult>>,
    writer: FileWriter,
    queued: Vec<FileWrite>,
    last_status: String,
    /// `events.jsonl` lines not yet queued: they go twice a second (with
    /// the status) and at the end, one append each time.
    events: String,
}

impl TrialFiles {
    /// `per_trial`: each trial's files; else the experiment's `results.jsonl`.
    pub(crate) fn new(exp_dir: PathBuf, per_trial: bool) -> Self {
        Self {
            exp_dir,
            per_trial,
            results: Vec::new(),
            writer: FileWriter::spawn(),
            queued: Vec::new(),
            last_status: String::new(),
            events: String::new(),
        }
    }

    fn trial_dir(&self, id: &str) -> PathBuf {
        self.exp_dir.join("trials").join(id)
    }

    /// Hands what is queued to the writer threads.
    pub(crate) fn flush(&mut self) {
        if !self.results.is_empty() {
            let results = std::mem::take(&mut self.results);
            self.queued.push(FileWrite::ResultLines { path: self.exp_dir.join(RESULTS), results });
        }
        self.writer.write(std::mem::take(&mut self.queued));
    }

    fn queue_events(&mut self) {
        if !self.events.is_empty() {
            let text = std::mem::take(&mut self.events);
            self.queued.push(FileWrite::Append { path: self.exp_dir.join(EVENTS), text });
        }
    }

    /// Waits for every write.
    pub(crate) async fn close(mut self) {
        self.flush();
        self.writer.close().await;
    }
}

impl Callback for TrialFiles {
    fn on_event(&mut self, event: &Event) -> Result<(), CallbackError> {
        if let Some(line) = event.to_json() {
            self.events.push_str(&line.to_string());
            self.events.push('\n');
        }
        match event {
            Event::TrialStarted { trial, .. } if self.per_trial => {
                self.queued.push(FileWrite::Params { trial_dir: self.trial_dir(&trial.id), config: trial.config.clone() });
            }
            Event::Exploited(e) if self.per_trial => {
                self.queued.push(FileWrite::Params { trial_dir: self.trial_dir(&e.trial_id), config: e.new_config.clone() });
            }
            Event::Result(result) if !self.per_trial => self.results.push(Arc::clone(result)),
            Event::Result(result) => {
                let trial_dir: Arc<Path> = Arc::from(self.trial_dir(&result.trial_id));
                self.queued.push(FileWrite::Result { trial_dir, result: Arc::clone(result) });
            }
            Event::Status(status) => {
                self.queue_events();
                let json = serde_json::to_string(&**status)?;
                if json != self.last_status {
                    self.queued.push(FileWrite::Snapshot { path: self.exp_dir.join(Status::FILE), json: json.clone() });
                    self.last_status = json;
                }
            }
            Event::ExperimentEnded(_) => {
                self.queue_events();
                self.queued.push(FileWrite::Remove { path: self.exp_dir.join(Status::FILE) });
            }
            _ => {}
        }
        Ok(())
    }
}
