//! The Slurm allocation nestor runs inside (`salloc`, `sbatch`, `nestor
//! submit`): its nodes as the pool's, each trial run a job step. Start-up
//! checks, in order: the nodes can reach the driver's report server; on a
//! resume, the job steps an earlier driver of the experiment left are
//! cancelled (they hold the nodes), and what those Slurm cannot end (a rank
//! on a node that died) still hold is kept out of the pool; each node runs
//! a probe step, and one that cannot (or that Slurm calls down) is set
//! aside; which nodes do not see the experiment's directory (their ranks
//! then ship checkpoints through the driver, to an object store, or the
//! sweep is refused).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use trainer::{Held, NodeResources, ProcessConfig, ResourcePool, SlurmAllocation, SlurmBackend};

use super::{Launcher, Nodes, Placement, Startup};
use crate::experiment::ExperimentFile;
use crate::TuneError;

pub(super) struct SlurmPlacement {
    allocation: SlurmAllocation,
    /// `[resources]`, standing for each node; else each node's share of the job.
    declared: Option<NodeResources>,
    /// Nodes that do not see the experiment's directory (found by [`Placement::check`]).
    unshared: Vec<String>,
    /// Nodes set aside before the sweep starts, with why.
    lost: Vec<(String, String)>,
    /// What job steps Slurm cannot end hold, node by node, and their ids.
    held: BTreeMap<String, Held>,
    stuck: Vec<String>,
}

impl SlurmPlacement {
    pub(super) fn new(allocation: SlurmAllocation, file: &ExperimentFile) -> Result<Self, TuneError> {
        let declared = if file.resources.is_empty() { None } else { Some(NodeResources::from_declared(&file.resources)?) };
        Ok(Self { allocation, declared, unshared: Vec::new(), lost: Vec::new(), held: BTreeMap::new(), stuck: Vec::new() })
    }
}

impl Placement for SlurmPlacement {
    fn check<'a>(&'a mut self, s: &'a Startup<'a>) -> BoxFuture<'a, Result<(), TuneError>> {
        async move {
            let a = &self.allocation;
            let file = s.file;
            file.cluster
                .check_reachable(file.trainer.as_ref().and_then(|t| t.report_bind), &format!("Slurm job {}", a.job_id))
                .map_err(|e| TuneError::Cluster(e.0))?;
            super::cluster_report_server(file, &self.allocation.nodes.iter().map(|n| n.addr.clone()).collect::<Vec<_>>())?;
            if s.resuming {
                // Steps an earlier driver of this experiment left in this job go first: they hold the nodes.
                let left = trainer::cancel_leftover_steps(&a.job_id, s.exp_dir).await;
                self.held = left.held();
                self.stuck = left.stuck.into_iter().map(|st| st.id).collect();
            }
            // Ranks read and write checkpoints below the experiment's directory where every node sees it;
            // else they ship them through the driver, to an object store.
            let root = std::path::absolute(file.experiment.local_root())
                .map_err(|source| TuneError::Io { path: PathBuf::from(file.experiment.local_root()), source })?;
            std::fs::create_dir_all(&root).map_err(|source| TuneError::Io { path: root.clone(), source })?;
            let check = a.check_nodes(&root, &trainer::probe_name(s.exp_dir), &[]).await.map_err(|e| TuneError::Cluster(e.0))?;
            self.unshared = check.unshared;
            self.lost = check.lost;
            // A node a stuck step of unknown shape runs on is left to it.
            for (node, h) in &self.held {
                if h.unknown && !self.lost.iter().any(|(n, _)| n == node) {
                    let why = format!("job steps Slurm cannot end ({}) hold it until the job ends", self.stuck.join(", "));
                    self.lost.push((node.clone(), why));
                }
            }
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
        let nodes: Vec<(String, NodeResources)> = a
            .node_resources()
            .into_iter()
            .filter(|(name, _)| !self.lost.iter().any(|(n, _)| n == name))
            .map(|(name, detected)| {
                let r = self.declared.clone().unwrap_or(detected);
                let r = match self.held.get(&name) {
                    Some(h) => without(r, h),
                    None => r,
                };
                (name, r)
            })
            .collect();
        let mut notes: Vec<String> =
            self.lost.iter().map(|(node, why)| format!("nestor: node {node} is set aside for the rest of the sweep: {why}")).collect();
        let held: Vec<String> = self
            .held
            .iter()
            .filter(|(node, h)| !h.unknown && nodes.iter().any(|(n, _)| n == *node))
            .map(|(node, h)| format!("{node} {} CPU(s)", h.cpus))
            .collect();
        if !held.is_empty() {
            notes.push(format!(
                "nestor: job steps Slurm cannot end ({}: a rank on a node that is gone) hold {} until the job ends; the sweep leaves them be",
                self.stuck.join(", "),
                held.join(", ")
            ));
        }
        let description = format!(
            "Slurm job {}, {} node(s): {}, {}",
            a.job_id,
            nodes.len(),
            nodes.iter().map(|(n, r)| format!("{n} {}", r.describe())).collect::<Vec<_>>().join(", "),
            nodes.first().map(|(_, r)| r.gpu_note.clone()).unwrap_or_default()
        );
        Nodes { pool: ResourcePool::cluster(nodes), description, notes }
    }

    fn backend<'a>(self: Box<Self>, mut config: ProcessConfig, s: &'a Startup<'a>) -> BoxFuture<'a, Result<Launcher, TuneError>> {
        async move {
            let file = s.file;
            // Other nodes reach the report server on the interface they are told of (or [trainer] report_bind).
            let (advertise, bind) =
                super::cluster_report_server(file, &self.allocation.nodes.iter().map(|n| n.addr.clone()).collect::<Vec<_>>())?;
            config.report_bind = bind;
            let shipping = !self.unshared.is_empty();
            let backend = SlurmBackend::start(config, self.allocation, Some(&advertise))
                .await
                .map_err(|source| TuneError::Io { path: "<report server>".into(), source })?
                .shipping(shipping)
                .experiment(s.exp_dir)
                .step_start_timeout(
                    file.cluster.step_start_timeout_s.map_or(trainer::DEFAULT_STEP_START_TIMEOUT, std::time::Duration::from_secs_f64),
                );
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

/// `r` less what stuck job steps hold on its node.
fn without(mut r: NodeResources, held: &Held) -> NodeResources {
    r.cpus = (r.cpus - f64::from(held.cpus)).max(0.0);
    // Memory the ranks did not ask for is the node's share per CPU: it goes with the CPUs.
    let memory = if held.memory_bytes > 0.0 || r.cpus + f64::from(held.cpus) <= 0.0 {
        held.memory_bytes
    } else {
        r.memory_bytes * f64::from(held.cpus) / (r.cpus + f64::from(held.cpus))
    };
    r.memory_bytes = (r.memory_bytes - memory).max(0.0);
    r.gpus.retain(|g| !held.gpus.contains(&g.index));
    r
}

/// This machine's name, as the nodes reach it (`gethostname`).
pub(super) fn host_name() -> String {
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
