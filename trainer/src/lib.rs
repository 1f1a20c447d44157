//! One training run of a trial: launching its workers (in-process Rust
//! functions or external processes), the gRPC report channel (tonic) between
//! workers and the driver, and the persistence of checkpoints.
//!
//! The driver side is the [`Backend`] seam: `launch` starts a trial and
//! returns a [`TrialHandle`]; everything the trial does afterwards arrives as
//! [`Event`]s on one channel. The worker side is [`Context`]: the same calls
//! (`config`, `report`, `checkpoint`) whether the worker is a closure on a
//! thread or a process reached over gRPC.
#![warn(missing_docs)]

mod ack;
mod aggregate;
mod backend;
mod checkpoint;
mod cluster;
mod collective;
mod command;
pub mod conformance;
mod context;
pub mod contract;
pub mod data;
mod function;
pub mod gpu_sampler;
pub mod gpu_usage;
mod groups;
pub mod inner;
mod intake;
mod process;
mod resources;
mod results;
mod scaling;
mod section;
mod service;
mod shards;
mod slurm;
pub mod split;
mod storage;
mod supervise;
pub mod tls;
mod token;
mod trainer;
mod warm;

/// The report-channel protocol, generated from `proto/nestor.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("nestor.v1");
}

pub use ack::{Ack, Acknowledged, NotAcknowledged};
pub use backend::{
    Backend, CheckpointRef, Directive, Event, EventKind, ExitOutcome, LaunchError, LaunchSpec, Reply, Report, StopLevel, TrialHandle,
};
pub use checkpoint::{check_source, checkpoint_dir_name, default_roots, persist_checkpoint, shard_for, CheckpointError};
pub use cluster::{ClusterBackend, ClusterConfig};
pub use collective::{CollectiveError, ReduceOp};
pub use command::{ProcessConfig, Warm};
pub use context::{Context, ReportError};
pub use function::{FunctionBackend, TrainFn, TrainResult};
pub use process::{log_tail, ProcessBackend};
pub use resources::{Allocation, Gpu, NodeResources, Request, ResourceError, ResourcePool, Source, WorkerBundle};
pub use results::{csv_field, ResultFiles, ResultLine};
pub use scaling::{DistBackend, FailureConfig, PlacementStrategy, Resources, ScalingConfig, ScalingError, TorchConfig};
pub use section::TrainerConfig;
pub use service::ReportServer;
pub use slurm::{
    cancel_leftover_jobs, cancel_leftovers as cancel_leftover_steps, check_job as check_slurm_job, expand_hostlist, parse_squeue,
    partition_node_addresses, probe_name, relay_output, BatchJob, Held, JobEnd as SlurmJobEnd, JobRow as SlurmJobRow,
    JobState as SlurmJobState, JobWatch as SlurmJobWatch, Leftovers, NodeCheck, RelayTarget, SlurmAllocation, SlurmBackend, SlurmError,
    SlurmJobsBackend, SlurmJobsConfig, SlurmNode, StuckStep, SubmitShape, DEFAULT_STEP_START_TIMEOUT, SQUEUE_FORMAT,
};
pub use storage::{cloud_store, Storage, StorageError, COMMITTED_MARKER};
pub use token::secrets_equal;
pub use trainer::{driver_runtime, hang_message, Step, TrainError, TrainLoop, TrainOutput, Trainer, TrainerParts};
pub use warm::take_inherited_fd;
