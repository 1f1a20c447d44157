//! `status.json`: what a running sweep writes twice a second for
//! `nestor status` and the dashboard, and what [`Event::Status`] carries.
//! One type, so the writer and its readers cannot drift apart.
//!
//! [`Event::Status`]: super::Event::Status

use std::path::Path;

use serde::{Deserialize, Serialize};

use search::Mode;
use trainer::WorkerBundle;

/// The live status of a running sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The format's version.
    pub version: u32,
    /// The driver's process id.
    pub pid: u32,
    /// The experiment's metric and mode.
    pub metric: Option<String>,
    /// Whether lower or higher is better.
    pub mode: Option<Mode>,
    /// Trials created so far.
    pub trials: u64,
    /// Trials the sweep runs at most (`num_samples`, or the grid's size).
    pub planned: u64,
    /// Trials TERMINATED, including those of earlier sessions.
    pub terminated: u64,
    /// Trials in ERROR, including those of earlier sessions.
    pub error: u64,
    /// Trials PAUSED by the scheduler.
    pub paused: u64,
    /// Trials still to run: not yet created, or waiting to (re)start.
    pub pending: u64,
    /// The best value of the metric so far, and whose.
    pub best: Option<Best>,
    /// Seconds since this session started.
    pub elapsed_s: f64,
    /// Seconds until every planned trial is done (or the time budget is
    /// spent), from the pace of this session; none before a trial ended.
    pub eta_s: Option<f64>,
    /// The running trials, oldest first.
    pub running: Vec<RunningTrial>,
}

/// The best result so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Best {
    /// Whose.
    pub trial_id: String,
    /// The metric's value.
    pub value: f64,
    /// At which iteration.
    pub iteration: u64,
}

/// A running trial, as `nestor status` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningTrial {
    /// Which.
    pub trial_id: String,
    /// Its latest iteration.
    pub iteration: u64,
    /// Its latest metrics (a JSON object), if it reported.
    pub metrics: Option<serde_json::Value>,
    /// Its config.
    pub config: serde_json::Value,
    /// Where its workers run.
    #[serde(default)]
    pub resources: Vec<WorkerBundle>,
}

impl Status {
    /// This format's version.
    pub const VERSION: u32 = 2;
    /// Its file in the experiment directory, present while a sweep runs.
    pub const FILE: &'static str = "status.json";

    /// The status a sweep at `exp_dir` last wrote: `None` when it wrote none
    /// (it is not running, or just started).
    pub fn read(exp_dir: &Path) -> Result<Option<Self>, String> {
        let path = exp_dir.join(Self::FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// Trials done (TERMINATED or ERROR).
    pub fn done(&self) -> u64 {
        self.terminated + self.error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Status::read(dir.path()), Ok(None));
        let s = Status {
            version: Status::VERSION,
            pid: 7,
            metric: Some("loss".into()),
            mode: Some(Mode::Min),
            trials: 3,
            planned: 10,
            terminated: 1,
            error: 1,
            paused: 0,
            pending: 7,
            best: Some(Best { trial_id: "trial_00001".into(), value: 0.5, iteration: 4 }),
            elapsed_s: 2.5,
            eta_s: Some(12.0),
            running: vec![RunningTrial {
                trial_id: "trial_00002".into(),
                iteration: 3,
                metrics: Some(serde_json::json!({"loss": 0.7})),
                config: serde_json::json!({"lr": 0.1}),
                resources: Vec::new(),
            }],
        };
        std::fs::write(dir.path().join(Status::FILE), serde_json::to_string(&s).unwrap_or_default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Status::read(dir.path()), Ok(Some(s.clone())));
        assert_eq!(s.done(), 2);
        std::fs::write(dir.path().join(Status::FILE), "{").unwrap_or_else(|e| panic!("{e}"));
        assert!(Status::read(dir.path()).is_err_and(|e| e.contains("status.json")));
    }
}
