//! Where a sweep's trials run: the seam between the experiment and the
//! machines. A placement says what the pool holds (this machine's
//! resources, each node of a cluster allocation, or a number of cluster
//! jobs), runs its start-up checks before anything is written, and starts
//! the backend that launches trials' worker processes there. One file per
//! engine: `local.rs` (this machine), `slurm.rs` (the Slurm allocation
//! nestor runs inside), `slurm_jobs.rs` (a Slurm job per trial run);
//! another engine is one more file and one more arm in [`find`].

use std::path::Path;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use trainer::{Backend, NodeResources, ProcessConfig, ResourcePool, Storage};

use crate::config::Kind;
use crate::experiment::ExperimentFile;
use crate::TuneError;

mod local;
mod slurm;
mod slurm_jobs;

/// What a placement's start-up needs to know of the sweep.
pub(crate) struct Startup<'a> {
    /// The resolved experiment file.
    pub file: &'a ExperimentFile,
    /// Its directory (absolute).
    pub exp_dir: &'a Path,
    /// Where its checkpoints go.
    pub storage: &'a Storage,
    /// Whether it continues an earlier run.
    pub resuming: bool,
    /// What one trial run of the experiment asks for.
    pub request: &'a trainer::Request,
}

/// The nodes a sweep runs on, as the pool books them.
pub(crate) struct Nodes {
    pub pool: ResourcePool,
    /// One line for people: the node(s) and their GPUs.
    pub description: String,
    /// More lines for people: nodes set aside before the sweep starts, what others hold.
    pub notes: Vec<String>,
}

/// A placement's backend, and what to tell people of it (where workers report).
pub(crate) struct Launcher {
    pub backend: Arc<dyn Backend>,
    pub notes: Vec<String>,
}

/// A placement engine. Its methods are called in order: [`Placement::check`]
/// once, before anything is written; [`Placement::nodes`]; and, for
/// trials that run as worker processes, [`Placement::backend`].
pub(crate) trait Placement: Send {
    /// Checks the engine can run the sweep (before anything is written):
    /// a cluster's nodes reach the driver and see its files; on a resume,
    /// what an earlier driver left running is gone first.
    fn check<'a>(&'a mut self, startup: &'a Startup<'a>) -> BoxFuture<'a, Result<(), TuneError>>;

    /// The nodes, for the pool.
    fn nodes(&self) -> Nodes;

    /// Starts the backend that launches trials' worker processes with
    /// `config`; with the notes to show people (where workers report).
    fn backend<'a>(self: Box<Self>, config: ProcessConfig, startup: &'a Startup<'a>) -> BoxFuture<'a, Result<Launcher, TuneError>>;
}

/// The placement of a sweep: the Slurm allocation nestor runs inside, for
/// worker processes (unless `[cluster] backend = "local"`), else this
/// machine, with `node` (set in Rust), the file's `[resources]`, or what
/// it detects.
pub(crate) fn find(file: &ExperimentFile, kind: &Kind, node: Option<NodeResources>) -> Result<Box<dyn Placement>, TuneError> {
    let backend = file.cluster.backend;
    let allocation = match kind {
        Kind::Train(trainer::TrainLoop::Process(_)) if backend == trainer::ClusterBackend::SlurmJobs => {
            return Ok(Box::new(slurm_jobs::SlurmJobsPlacement::new(file)?));
        }
        Kind::Train(trainer::TrainLoop::Process(_)) => file.cluster.allocation().map_err(|e| TuneError::Cluster(e.to_string()))?,
        _ if matches!(backend, trainer::ClusterBackend::Slurm | trainer::ClusterBackend::SlurmJobs) => {
            let name = if backend == trainer::ClusterBackend::Slurm { "slurm" } else { "slurm_jobs" };
            return Err(TuneError::Cluster(format!(
                "cluster.backend = \"{name}\" runs worker processes: give a [trainer] command (in-process trials run on this machine)"
            )));
        }
        _ => None,
    };
    Ok(match allocation {
        Some(a) => Box::new(slurm::SlurmPlacement::new(a, file)?),
        None => Box::new(local::LocalPlacement::new(file, kind, node)?),
    })
}

/// Where a cluster engine's report server listens, and the address its
/// nodes are told: `[cluster] report_address` (else this machine's host
/// name), and `[trainer] report_bind` (else that address's interface, or
/// the one this machine reaches the nodes at `toward` from; never every
/// interface). Called by `check`, before anything is written, and by
/// `backend`.
pub(crate) fn cluster_report_server(file: &ExperimentFile, toward: &[String]) -> Result<(String, std::net::SocketAddr), TuneError> {
    let advertise = file.cluster.report_address.clone().unwrap_or_else(slurm::host_name);
    let bind = match file.trainer.as_ref().and_then(|t| t.report_bind) {
        Some(b) => b,
        None => trainer::ClusterConfig::report_bind_for(&advertise, toward).map_err(|e| TuneError::Cluster(e.0))?,
    };
    Ok((advertise, bind))
}
