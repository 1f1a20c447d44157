//! The loop's public output: a typed stream of [`Event`]s and the
//! [`Callback`] trait that consumes it.
//!
//! The loop hands every event to its reporter, which passes it, in order,
//! to each consumer: the console table, `status.json`, the trial files, the
//! loggers of `[[callbacks]]` and whatever a user added with
//! `Tuner::callback`. Results and checkpoints are passed on once they are
//! durable, so a consumer never sees a result a crash could take back.
//!
//! Built-in consumers are cheap and run on the loop. Every other callback
//! runs on a thread of its own behind a bounded queue (`Isolated`): one
//! that fails is logged and goes on, one that panics, falls too far behind
//! or takes longer than its deadline over one event is cut off and logged.
//! None of them can stop the sweep or lose a result.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use search::{Mode, TrialResult};

use crate::store::{ExploitRecord, TrialRecord};
use crate::text::headline;

mod isolated;
pub mod mlflow;
mod status;
pub mod tensorboard;
mod trial_files;
pub mod wandb;

pub(crate) use isolated::Isolated;
pub use status::{Best, RunningTrial, Status};
pub(crate) use trial_files::TrialFiles;

/// How long a callback may take over one event, or over closing, by default.
pub const DEFAULT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// What a callback's failure is.
pub type CallbackError = Box<dyn std::error::Error + Send + Sync>;

/// A consumer of a sweep's [`Event`]s (Ray Tune's `Callback`).
///
/// Events come in the order the sweep made them, one at a time, on one
/// thread; a callback sees every event after the one it is given at its
/// start. A callback registered with `Tuner::callback` or `[[callbacks]]`
/// runs on a thread of its own, so it may block (write files, call a
/// server), but not for longer than its deadline.
///
/// ```
/// use tuner::callback::{Callback, CallbackError, Event};
///
/// #[derive(Default)]
/// struct CountResults(usize);
///
/// impl Callback for CountResults {
///     fn on_event(&mut self, event: &Event) -> Result<(), CallbackError> {
///         if let Event::Result(_) = event {
///             self.0 += 1;
///         }
///         Ok(())
///     }
/// }
/// ```
pub trait Callback: Send {
    /// Takes one event. An error is logged and the callback goes on.
    fn on_event(&mut self, event: &Event) -> Result<(), CallbackError>;

    /// The sweep is over (finished, failed or interrupted) and every event
    /// was given: write out what is buffered, close files and connections.
    fn close(&mut self) -> Result<(), CallbackError> {
        Ok(())
    }

    /// The name logs use for it.
    fn name(&self) -> String {
        let full = std::any::type_name::<Self>();
        full.rsplit("::").next().unwrap_or(full).to_string()
    }
}

impl<F: FnMut(&Event) + Send> Callback for F {
    fn on_event(&mut self, event: &Event) -> Result<(), CallbackError> {
        self(event);
        Ok(())
    }

    fn name(&self) -> String {
        "closure".into()
    }
}

/// The sweep, as it starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExperimentInfo {
    /// `experiment.name`.
    pub name: String,
    /// The experiment directory.
    pub dir: PathBuf,
    /// The metric every result carries, and its direction.
    pub metric: Option<String>,
    /// Whether lower or higher is better.
    pub mode: Option<Mode>,
    /// How many trials the sweep runs at most.
    pub planned: u64,
    /// The wall-clock budget, if any.
    pub time_budget_s: Option<f64>,
    /// A resumed sweep: trials and results from before exist.
    pub resumed: bool,
}

/// How the sweep ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// Trials TERMINATED, including those of earlier sessions.
    pub terminated: u64,
    /// Trials in ERROR, including those of earlier sessions.
    pub errored: u64,
    /// Trials created so far.
    pub trials: u64,
    /// Ctrl-C, a full disk or lost nodes ended it early; resume it.
    pub stopped_early: bool,
    /// Seconds this session ran.
    pub elapsed_s: f64,
}

/// Why the sweep stops before every trial has run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Ctrl-C or SIGTERM: running trials stop gracefully.
    Interrupted,
    /// A second Ctrl-C: running trials are killed.
    Killed,
    /// `time_budget_s` is spent.
    TimeBudget,
    /// A stopper ended the sweep.
    Stopper,
    /// A trial failed under `fail_fast`.
    FailFast,
    /// The disk holding the experiment is full.
    DiskFull,
    /// Too few nodes are left for a trial.
    OutOfNodes,
}

/// One thing that happened in a sweep.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event {
    /// The sweep starts (or resumes).
    ExperimentStarted(Arc<ExperimentInfo>),
    /// A trial's run started: a new trial, a restart, a resize or an exploit
    /// (`trial.restarts`, `resizes`, `exploits` say which), or a paused one
    /// resuming (`resumed`).
    TrialStarted {
        /// The trial as it starts: config, resources and nodes.
        trial: Arc<TrialRecord>,
        /// It was PAUSED and resumes.
        resumed: bool,
    },
    /// A result, durable in the store.
    Result(Arc<TrialResult>),
    /// A checkpoint, durable and committed: it is kept (until retention drops it).
    CheckpointCommitted {
        /// Whose.
        trial_id: String,
        /// The iteration it was saved at.
        iteration: u64,
        /// Where it is.
        uri: String,
    },
    /// A trial's run ended and the scheduler paused it.
    TrialPaused(Arc<TrialRecord>),
    /// A trial ended TERMINATED.
    TrialCompleted(Arc<TrialRecord>),
    /// A trial ended in ERROR for good.
    TrialErrored(Arc<TrialRecord>),
    /// A trial's run was stopped with the sweep (Ctrl-C, a full disk, lost
    /// nodes): it is PENDING, for `nestor resume`.
    TrialInterrupted(Arc<TrialRecord>),
    /// A run failed and the trial runs again.
    TrialRestarted {
        /// Which.
        trial_id: String,
        /// The failure.
        error: String,
        /// Where it goes on from: a checkpoint's name, or `the start`.
        from: String,
        /// `failure 1 of 3` and the like.
        count: String,
        /// The sweep is stopping: it restarts on `nestor resume`.
        on_resume: bool,
    },
    /// PBT: a trial took another's checkpoint and a new config.
    Exploited(Arc<ExploitRecord>),
    /// A trial restarts with another number of workers.
    Resized {
        /// Which.
        trial_id: String,
        /// Workers before.
        was: usize,
        /// Workers after.
        workers: usize,
        /// The checkpoint it goes on from.
        from: String,
    },
    /// A node was lost and is not used again in this sweep.
    NodeSetAside {
        /// The node.
        node: String,
        /// Why.
        why: String,
    },
    /// The sweep stops before every trial has run.
    Stopping {
        /// Why.
        reason: StopReason,
        /// For people.
        message: String,
    },
    /// Something worth telling people that is none of the above.
    Message(String),
    /// Twice a second while trials run: counts, best so far, ETA, running trials.
    Status(Arc<Status>),
    /// The sweep is over; nothing follows.
    ExperimentEnded(Arc<Summary>),
}

impl Event {
    /// The event's name, as logs and JSON write it.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::ExperimentStarted(_) => "experiment_started",
            Event::TrialStarted { .. } => "trial_started",
            Event::Result(_) => "result",
            Event::CheckpointCommitted { .. } => "checkpoint_committed",
            Event::TrialPaused(_) => "trial_paused",
            Event::TrialCompleted(_) => "trial_completed",
            Event::TrialErrored(_) => "trial_errored",
            Event::TrialInterrupted(_) => "trial_interrupted",
            Event::TrialRestarted { .. } => "trial_restarted",
            Event::Exploited(_) => "exploited",
            Event::Resized { .. } => "resized",
            Event::NodeSetAside { .. } => "node_set_aside",
            Event::Stopping { .. } => "stopping",
            Event::Message(_) => "message",
            Event::Status(_) => "status",
            Event::ExperimentEnded(_) => "experiment_ended",
        }
    }

    /// The trial it is about, if one.
    pub fn trial_id(&self) -> Option<&str> {
        match self {
            Event::TrialStarted { trial, .. } => Some(&trial.id),
            Event::TrialPaused(t) | Event::TrialCompleted(t) | Event::TrialErrored(t) | Event::TrialInterrupted(t) => Some(&t.id),
            Event::Result(r) => Some(&r.trial_id),
            Event::CheckpointCommitted { trial_id, .. } | Event::TrialRestarted { trial_id, .. } | Event::Resized { trial_id, .. } => {
                Some(trial_id)
            }
            Event::Exploited(e) => Some(&e.trial_id),
            _ => None,
        }
    }
}

impl Event {
    /// The event as one line of `events.jsonl` (the experiment's log of
    /// what happened to its trials); `None` for results and status ticks,
    /// which have files of their own.
    pub fn to_json(&self) -> Option<serde_json::Value> {
        use serde_json::json;
        let at = crate::clock::now_unix();
        let trial = |t: &TrialRecord| {
            let nodes: Vec<&str> = t.resources.iter().map(|b| b.node.as_str()).collect();
            json!({
                "trial_id": t.id, "status": t.status.as_str(), "config": t.config, "nodes": nodes,
                "iteration": t.last_result.as_ref().map_or(0, |r| r.training_iteration),
                "restarts": t.restarts, "failures": t.failures, "exploits": t.exploits, "error": t.error,
            })
        };
        let mut v = match self {
            Event::Result(_) | Event::Status(_) => return None,
            Event::ExperimentStarted(i) => serde_json::to_value(&**i).ok()?,
            Event::TrialStarted { trial: t, resumed } => {
                let mut v = trial(t);
                v["resumed"] = json!(resumed);
                v
            }
            Event::TrialPaused(t) | Event::TrialCompleted(t) | Event::TrialErrored(t) | Event::TrialInterrupted(t) => trial(t),
            Event::CheckpointCommitted { trial_id, iteration, uri } => json!({"trial_id": trial_id, "iteration": iteration, "uri": uri}),
            Event::TrialRestarted { trial_id, error, from, count, on_resume } => {
                json!({"trial_id": trial_id, "error": error, "from": from, "count": count, "on_resume": on_resume})
            }
            Event::Exploited(e) => serde_json::to_value(&**e).ok()?,
            Event::Resized { trial_id, was, workers, from } => json!({"trial_id": trial_id, "was": was, "workers": workers, "from": from}),
            Event::NodeSetAside { node, why } => json!({"node": node, "why": why}),
            Event::Stopping { reason, message } => json!({"reason": reason, "message": message}),
            Event::Message(m) => json!({"message": m}),
            Event::ExperimentEnded(s) => serde_json::to_value(&**s).ok()?,
        };
        if let Some(m) = v.as_object_mut() {
            m.insert("event".into(), json!(self.kind()));
            m.insert("at".into(), json!(at));
        }
        Some(v)
    }
}

/// The line people read for an event worth a line of its own (restarts,
/// exploits, nodes, stops); empty for the others.
impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::TrialRestarted { trial_id, error, from, count, on_resume } => {
                let what = if *on_resume { "left to resume from" } else { "restarting from" };
                write!(f, "{trial_id}: {}; {what} {from} ({count})", headline(error))
            }
            Event::Exploited(e) => {
                let ckpt = crate::text::checkpoint_name(&e.checkpoint);
                write!(f, "{} exploits {} ({ckpt}): {}", e.trial_id, e.donor, crate::text::config_change(&e.old_config, &e.new_config))
            }
            Event::Resized { trial_id, was, workers, from } => {
                write!(f, "{trial_id} restarts with {workers} worker(s) (was {was}) from {from}")
            }
            Event::NodeSetAside { node, why } => write!(f, "node {node} is set aside for the rest of the sweep: {why}"),
            Event::Stopping { message, .. } | Event::Message(message) => f.write_str(message),
            _ => Ok(()),
        }
    }
}

/// One `[[callbacks]]` table of an experiment file: a logger by its `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum CallbackConfig {
    /// TensorBoard event files per trial.
    Tensorboard(tensorboard::TensorBoardConfig),
    /// A run per trial on an MLflow tracking server.
    Mlflow(mlflow::MlflowConfig),
    /// A run per trial in Weights & Biases (through its Python package).
    Wandb(wandb::WandbConfig),
}

impl CallbackConfig {
    /// The callback, for the experiment `name` at `exp_dir`; what is wrong
    /// with its settings, naming the key.
    pub fn build(&self, exp_dir: &std::path::Path, name: &str) -> Result<Box<dyn Callback>, String> {
        Ok(match self {
            CallbackConfig::Tensorboard(c) => Box::new(tensorboard::TensorBoardLogger::new(exp_dir, c.clone())),
            #[cfg(feature = "mlflow")]
            CallbackConfig::Mlflow(c) => Box::new(mlflow::MlflowLogger::new(exp_dir, name, c)?),
            #[cfg(not(feature = "mlflow"))]
            CallbackConfig::Mlflow(_) => {
                return Err("the MLflow logger is not in this build of nestor: build it with the `mlflow` feature (a default one)".into())
            }
            CallbackConfig::Wandb(c) => Box::new(wandb::WandbLogger::new(exp_dir, name, c)?),
        })
    }

    /// Its `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            CallbackConfig::Tensorboard(_) => "tensorboard",
            CallbackConfig::Mlflow(_) => "mlflow",
            CallbackConfig::Wandb(_) => "wandb",
        }
    }
}
