//! The Slurm allocation nestor runs inside (`salloc`, `sbatch`, `nestor
//! submit`): its nodes as the pool's, each trial run a job step. Start-up
//! checks, in order: the nodes can reach the driver's report server; on a
//! resume, the job steps an earlier driver of the experiment left are
//! cancelled (they hold the nodes); which nodes do not see the experiment's
//! directory (their ranks then ship checkpoints through the driver, to an
//! object store, or the sweep is refused).

use std::path::PathBuf;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use trainer::{NodeResources, ProcessConfig, ResourcePool, SlurmAllocation, SlurmBackend};

use super::{Launcher, Nodes, Placement, Startup};
use crate::experiment::ExperimentFile;
use crate::TuneError;

pub(super) struct SlurmPlacement {
    allocation: SlurmAllocation,
    /// `[resources]`, standing for each node; else each node's share of the job.
    declared: Option<NodeResources>,
    /// Nodes that do not see the experiment's directory (found by [`Placement::check`]).
    unshared: Vec<String>,
}

impl SlurmPlacement {
    pub(super) fn new(allocation: SlurmAllocation, file: &ExperimentFile) -> Result<Self, TuneError> {
        let declared = if file.resources.is_empty() { None } else { Some(NodeResources::from_declared(&file.resources)?) };
        Ok(Self { allocation, declared, unshared: Vec::new() })
    }
}

impl Placement for SlurmPlacement {
    fn check<'a>(&'a mut self, s: &'a Startup<'a>) -> BoxFuture<'a, Result<(), TuneError>> {
        async move {
            let a = &self.allocation;
            let file = s.file;
            file.cluster
                .check_reachable(file.trainer.as_ref().and_then(|t| t.report_bind), &a.job_id)
                .map_err(|e| TuneError::Cluster(e.0))?;
            if s.resuming {
                // Steps an earlier driver of this experiment left in this job go first: they hold the nodes.
                trainer::cancel_leftover_steps(&a.job_id, s.exp_dir).await;
            }
            // Ranks read and write checkpoints below the experiment's directory where every node sees it;
            // else they ship them through the driver, to an object store.
            let root = std::path::absolute(file.experiment.local_root())
                .map_err(|source| TuneError::Io { path: PathBuf::from(file.experiment.local_root()), source })?;
            std::fs::create_dir_all(&root).map_err(|source| TuneError::Io { path: root.clone(), source })?;
            self.unshared = a.unshared_nodes(&root).map_err(|e| TuneError::Cluster(e.0))?;
            if !self.unshared.is_empty() && file.experiment.storage_url().is_none() {
                return Err(TuneError::Cluster(format!(
                    "{} is not visible on {} (a file written here was not there), and checkpoints go below it: a trial \
                     that runs there could neither save nor resume from them. Put the experiment on a file system all \
                     nodes share (local_dir, or --storage), or send checkpoints to an object store \
                     (experiment.storage = \"s3://bucket/prefix\"; ranks then upload their shards to it, or ship them through the driver when they cannot reach it)",
                    root.display(),
                    self.unshared.join(", ")
                )));
            }
            Ok(())
        }
        .boxed()
    }

    fn nodes(&self) -> Nodes {
        let a = &self.allocation;
        let nodes: Vec<(String, NodeResources)> =
            a.node_resources().into_iter().map(|(name, detected)| (name, self.declared.clone().unwrap_or(detected))).collect();
        let description = format!(
            "Slurm job {}, {} node(s): {}, {}",
            a.job_id,
            nodes.len(),
            nodes.iter().map(|(n, r)| format!("{n} {}", r.describe())).collect::<Vec<_>>().join(", "),
            nodes.first().map(|(_, r)| r.gpu_note.clone()).unwrap_or_default()
        );
        Nodes { pool: ResourcePool::cluster(nodes), description }
    }

    fn backend<'a>(self: Box<Self>, mut config: ProcessConfig, s: &'a Startup<'a>) -> BoxFuture<'a, Result<Launcher, TuneError>> {
        async move {
            let file = s.file;
            // Other nodes must reach the report server: every interface, unless [trainer] report_bind says.
            if file.trainer.as_ref().and_then(|t| t.report_bind).is_none() {
                config.report_bind = std::net::SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0));
            }
            let advertise = file.cluster.report_address.clone().unwrap_or_else(host_name);
            let shipping = !self.unshared.is_empty();
            let backend = SlurmBackend::start(config, self.allocation, Some(&advertise))
                .await
                .map_err(|source| TuneError::Io { path: "<report server>".into(), source })?
                .shipping(shipping)
                .experiment(s.exp_dir);
            let mut notes = vec![format!("nestor: workers report to {}", backend.report_url())];
            if shipping {
                notes.push(format!(
                    "nestor: {} is not shared with {}: ranks ship checkpoints through the driver to {}",
                    s.exp_dir.display(),
                    self.unshared.join(", "),
                    s.storage.uri("")
                ));
            }
            Ok(Launcher { backend: Arc::new(backend), notes })
        }
        .boxed()
    }
}

/// This machine's name, as the nodes reach it (`gethostname`).
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok && end > 0 {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "localhost".into()
    }
}
