//! The Rust face of an experiment: `TuneConfig`, `RunConfig`, stop criteria
//! and trainables, as in Ray Tune.

use std::collections::BTreeMap;
use std::path::PathBuf;

use schedulers::Stopper;
use search::{Config, Mode};
use serde::{Deserialize, Serialize};
pub use trainer::FailureConfig;
use trainer::{Context, FunctionBackend, ProcessConfig, ScalingConfig, TrainLoop, TrainResult, Trainer};

pub use schedulers::SchedulerConfig;
use search::Algorithm;

/// What to tune and how: Ray Tune's `TuneConfig`.
#[derive(Debug, Clone)]
pub struct TuneConfig {
    /// The metric to optimise; `best_result` and schedulers use it.
    pub metric: Option<String>,
    /// Whether `metric` is minimised or maximised.
    pub mode: Option<Mode>,
    /// Samples from the space (each expanded over the grid axes).
    pub num_samples: u64,
    /// Trials running at once (default: the number of CPUs).
    pub max_concurrent_trials: Option<usize>,
    /// Stop the sweep after this many seconds.
    pub time_budget_s: Option<f64>,
    /// Sampling seed (random and recorded when `None`).
    pub seed: Option<u64>,
    /// The search algorithm.
    pub search: Algorithm,
    /// Configs (possibly partial) to run first.
    pub points_to_evaluate: Vec<Config>,
    /// Cap on the searcher's live trials.
    pub max_concurrent_search: Option<usize>,
    /// Run each config this many times (Ray's `Repeater`).
    pub repeat: Option<usize>,
    /// TPE's settings (`[search]` `n_startup_trials`, `n_ei_candidates`,
    /// `multivariate`); `None` keeps what the experiment has.
    pub tpe: Option<search::TpeOptions>,
    /// BOHB's settings (`[search]` `min_points_in_model`, `top_n_percent`,
    /// `random_fraction`, `n_ei_candidates` as `num_samples`,
    /// `bandwidth_factor`); its budget is the scheduler's `time_attr`.
    /// `None` keeps what the experiment has.
    pub bohb: Option<search::BohbOptions>,
    /// The trial scheduler.
    pub scheduler: SchedulerConfig,
}

impl Default for TuneConfig {
    fn default() -> Self {
        Self {
            metric: None,
            mode: None,
            num_samples: 1,
            max_concurrent_trials: None,
            time_budget_s: None,
            seed: None,
            search: Algorithm::Random,
            points_to_evaluate: Vec::new(),
            max_concurrent_search: None,
            repeat: None,
            tpe: None,
            bohb: None,
            scheduler: SchedulerConfig::Fifo,
        }
    }
}

/// When trials stop: Ray's dict form (`metric >= threshold`, with
/// `training_iteration` for a fixed length) and, optionally, a closure.
#[derive(Default)]
pub struct Stop {
    /// Metric -> threshold; a trial stops once any is reached (`>=`).
    pub thresholds: BTreeMap<String, f64>,
    /// A custom stopper.
    pub custom: Option<Box<dyn Stopper>>,
}

impl std::fmt::Debug for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stop").field("thresholds", &self.thresholds).field("custom", &self.custom.is_some()).finish()
    }
}

impl Stop {
    /// No criteria: trials run until their trainable returns.
    pub fn new() -> Self {
        Self::default()
    }
    /// Stop each trial after `n` iterations.
    pub fn iterations(self, n: u64) -> Self {
        self.at_least("training_iteration", n as f64)
    }
    /// Stop a trial once `metric >= threshold`.
    pub fn at_least(mut self, metric: impl Into<String>, threshold: f64) -> Self {
        self.thresholds.insert(metric.into(), threshold);
        self
    }
    /// Stop a trial when `f(trial_id, result)` returns true.
    pub fn when<F>(mut self, f: F) -> Self
    where
        F: FnMut(&str, &search::TrialResult) -> bool + Send + 'static,
    {
        self.custom = Some(Box::new(schedulers::FnStopper(f)));
        self
    }
}

/// How the progress of a sweep is shown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProgressMode {
    /// A live table on a terminal, plain lines otherwise.
    #[default]
    Auto,
    /// Plain lines.
    Plain,
    /// Nothing.
    Quiet,
}

/// Which checkpoints to keep: Ray's `CheckpointConfig` (TOML `[checkpoint]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Committed checkpoints kept per trial (default: all): the best by
    /// `score_attribute` (or the newest), and the latest besides, which a
    /// restart needs (Ray's rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_to_keep: Option<usize>,
    /// The metric that ranks checkpoints (default: their age).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_attribute: Option<String>,
    /// `max` (default) or `min`.
    #[serde(default = "max_mode")]
    pub score_order: Mode,
    /// How often, in iterations, trials save a checkpoint (Ray's
    /// `checkpoint_frequency`). Workers read it as `ctx.checkpoint_frequency()`
    /// (`NESTOR_CHECKPOINT_FREQUENCY`); schedulers that pause trials need it.
    /// `"auto"`: every iteration when the scheduler pauses trials, else
    /// as the trials choose (what the Python driver asks for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency: Option<Frequency>,
    /// Directories workers may checkpoint from, besides the trial directory,
    /// the temporary directory and the workers' working directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_dirs: Vec<PathBuf>,
}

/// `[checkpoint] frequency`: a number of iterations, or `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Frequency {
    /// Every this many iterations.
    Every(u64),
    /// Every iteration when the scheduler pauses trials, else none asked for
    /// (settled when the experiment is resolved).
    Auto(AutoWord),
}

/// The word `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoWord {
    /// `"auto"`.
    Auto,
}

impl From<u64> for Frequency {
    fn from(n: u64) -> Self {
        Frequency::Every(n)
    }
}

impl CheckpointConfig {
    /// Every how many iterations trials save a checkpoint, when that is asked of them.
    pub fn every(&self) -> Option<u64> {
        match self.frequency {
            Some(Frequency::Every(n)) => Some(n),
            _ => None,
        }
    }
}

fn max_mode() -> Mode {
    Mode::Max
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self { num_to_keep: None, score_attribute: None, score_order: Mode::Max, frequency: None, allowed_dirs: Vec::new() }
    }
}

impl CheckpointConfig {
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Where and how the sweep runs: Ray's `RunConfig`.
#[derive(Debug)]
pub struct RunConfig {
    /// The experiment's name; its directory is `<storage>/<name>`.
    pub name: String,
    /// Where experiments go (the result store, logs and, unless
    /// `storage_url` says otherwise, checkpoints).
    pub storage: PathBuf,
    /// Checkpoints go to `<storage_url>/<name>/trials/<id>/` instead:
    /// `s3://bucket/prefix`, `gs://...`, `az://...`.
    pub storage_url: Option<String>,
    /// Which checkpoints to keep.
    pub checkpoint: CheckpointConfig,
    /// Restarts after failures, hang detection.
    pub failure: FailureConfig,
    /// Stop criteria.
    pub stop: Stop,
    /// End the sweep at the first trial error.
    pub fail_fast: bool,
    /// Write each trial's files for people (`params.json`, `result.jsonl`,
    /// `progress.csv`); default true. The store has every result either way.
    pub trial_files: bool,
    /// Show each rank's output of a command trainer on the console, a line
    /// at a time behind `(trial_00003 rank 1)`; default true (Ray's `log_to_driver`).
    pub log_to_driver: bool,
    /// Progress display.
    pub progress: ProgressMode,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            name: "experiment".into(),
            storage: PathBuf::from("nestor-runs"),
            storage_url: None,
            checkpoint: CheckpointConfig::default(),
            failure: FailureConfig::default(),
            stop: Stop::new(),
            fail_fast: false,
            trial_files: true,
            log_to_driver: true,
            progress: ProgressMode::Auto,
        }
    }
}

/// What each trial runs, and how it scales: a Rust function (one thread per
/// worker) or an external command (one process per worker), with a
/// [`ScalingConfig`] (one single-CPU worker by default).
#[derive(Clone, Debug)]
pub struct Trainable {
    pub(crate) kind: Kind,
    pub(crate) scaling: ScalingConfig,
    /// A [`Trainer`]'s run settings, the defaults of a sweep built from it.
    pub(crate) defaults: Option<TrainerDefaults>,
}

/// What a [`Trainer`] said of its run that a sweep of it keeps (as Ray's
/// `Tuner(trainer)` keeps the trainer's `train_loop_config` and `run_config`
/// unless the tuner's own replace them).
#[derive(Clone, Debug)]
pub(crate) struct TrainerDefaults {
    pub config: serde_json::Value,
    pub name: Option<String>,
    pub storage: PathBuf,
    pub failure: FailureConfig,
}

/// What a trainable runs.
#[derive(Clone, Debug)]
pub(crate) enum Kind {
    /// Real workers: threads or processes.
    Train(TrainLoop),
    /// Learning curves replayed under a virtual clock.
    Simulated(crate::curves::Curves),
}

/// A [`Trainer`] in a sweep: its train loop and scaling, once per trial.
impl From<Trainer> for Trainable {
    fn from(t: Trainer) -> Self {
        let p = t.into_parts();
        let defaults = TrainerDefaults { config: p.config, name: p.name, storage: p.storage, failure: p.failure };
        Self { kind: Kind::Train(p.train_loop), scaling: p.scaling, defaults: Some(defaults) }
    }
}

impl Trainable {
    /// A Rust training function, run once per worker (rank) of each trial.
    pub fn function<F>(f: F) -> Self
    where
        F: Fn(&mut Context) -> TrainResult + Send + Sync + 'static,
    {
        Self { kind: Kind::Train(TrainLoop::Function(FunctionBackend::new(f))), scaling: ScalingConfig::default(), defaults: None }
    }

    /// A worker command, e.g. `["python", "train.py"]`.
    pub fn command<I, S>(command: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::process(ProcessConfig::new(command.into_iter().map(Into::into).collect()))
    }

    /// A worker command with every process setting.
    pub fn process(config: ProcessConfig) -> Self {
        Self { kind: Kind::Train(TrainLoop::Process(config)), scaling: ScalingConfig::default(), defaults: None }
    }

    /// A simulation: each trial replays its learning curve from `curves`
    /// under a virtual clock (see [`crate::simulate`]). The sweep's
    /// `max_concurrent_trials` (default 4) is the number of worker slots.
    pub fn simulated(curves: crate::curves::Curves) -> Self {
        Self { kind: Kind::Simulated(curves), scaling: ScalingConfig::default(), defaults: None }
    }

    /// Sets the workers per trial and what each needs.
    pub fn scaling(mut self, scaling: ScalingConfig) -> Self {
        self.scaling = scaling;
        self
    }

    /// The scaling config.
    pub fn scaling_config(&self) -> &ScalingConfig {
        &self.scaling
    }
}
