//! nestor's experiment layer: the `Tuner` loop, the sled result store,
//! result queries, TOML experiment files and the `nestor` command line.
#![warn(missing_docs)]

mod alloc;
pub mod callback;
pub mod cli;
mod clock;
mod config;
mod curves;
pub mod dashboard;
mod echo;
mod experiment;
mod files;
pub mod hooks;
mod journal;
mod opening;
mod placement;
mod progress;
pub mod remote;
mod result_grid;
mod retention;
mod runner;
pub mod simulate;
pub mod store;
mod text;
mod tuner;

use std::path::PathBuf;

pub use alloc::return_freed_memory_at_once;
pub use config::{
    AutoWord, CheckpointConfig, FailureConfig, Frequency, ProgressMode, RunConfig, SchedulerConfig, Stop, Trainable, TuneConfig,
};
pub use experiment::{ExperimentError, ExperimentFile, ExperimentSection, Resolved};
pub use opening::Errored;
pub use result_grid::{QueryError, ResultGrid, Scope, TrialOutcome};
pub use schedulers::{
    AshaConfig, AshaType, HyperBandConfig, MedianStoppingConfig, Pb2Config, PbtConfig, ResourceChangingConfig, TrialStatus,
    WorkerAllocation,
};
pub use tuner::Tuner;

/// Re-exports for writing trainables without naming the other crates.
pub use search::{Algorithm, BohbOptions, Domain, Mode, SearchConfig, Space, TpeOptions};
pub use trainer::{
    Context, DistBackend, NodeResources, PlacementStrategy, ReduceOp, ReportError, Resources, ScalingConfig, TorchConfig, TrainOutput,
    TrainResult, Trainer, TrainerConfig,
};

/// Errors of running or restoring a sweep.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// The experiment file or config is invalid.
    #[error(transparent)]
    Experiment(#[from] ExperimentError),
    /// The space, points or searcher state are invalid.
    #[error(transparent)]
    Search(#[from] search::SearchError),
    /// The result store failed.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// A result query failed.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// The scaling config breaks a rule.
    #[error("trainer.{}: {}", .0.key, .0.message)]
    Scaling(#[from] trainer::ScalingError),
    /// A trial's bundles can never fit on the node.
    #[error(transparent)]
    Resources(#[from] trainer::ResourceError),
    /// The cluster (a Slurm allocation) cannot be used.
    #[error("cluster: {0}")]
    Cluster(String),
    /// The checkpoint storage cannot be used.
    #[error(transparent)]
    Storage(trainer::StorageError),
    /// A fresh run would overwrite an experiment.
    #[error("experiment directory {0} already exists; resume it with `nestor resume {0}` or pick another experiment.name")]
    Exists(PathBuf),
    /// Nothing to run.
    #[error("no trainer: give a [trainer] command in the experiment file, or a Rust trainable to Tuner::restore")]
    NoTrainer,
    /// The stored experiment is unusable.
    #[error("experiment {0}: {1}")]
    Corrupt(PathBuf, String),
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A trial failed and fail_fast is set.
    #[error("fail_fast: {0}")]
    FailFast(String),
    /// The sweep calls Python code that no driver serves here.
    #[error("python: {0}")]
    Hooks(String),
    /// Ctrl-C: the sweep stopped early; resume it later.
    #[error("interrupted; resume with `nestor resume {}`", .0.display())]
    Interrupted(PathBuf),
}
