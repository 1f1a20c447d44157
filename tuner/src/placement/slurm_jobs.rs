//! A Slurm job per trial run (`[cluster] backend = "slurm_jobs"`): the
//! driver runs anywhere `sbatch` works (a login node) and submits each run
//! of a trial as a job of its own; Slurm picks its nodes. The pool is a
//! number of jobs (`[cluster.jobs] max_jobs`), not nodes. Start-up checks,
//! in order: `[cluster.jobs]` itself; the report address is one the nodes
//! reach; Slurm would take a job of the experiment's shape (`sbatch
//! --test-only`: a bad partition, account or QOS is refused once, by
//! name, before anything is written); on a resume, the jobs an earlier
//! driver of the experiment left queued or running are cancelled (their
//! trials go on from their latest checkpoints).

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use trainer::{ProcessConfig, ResourcePool, SlurmJobsBackend, SlurmJobsConfig};

use super::{Launcher, Nodes, Placement, Startup};
use crate::experiment::ExperimentFile;
use crate::TuneError;

pub(super) struct SlurmJobsPlacement {
    jobs: SlurmJobsConfig,
    /// What Slurm said it would do with a job of the experiment's shape.
    answer: String,
    /// Jobs an earlier driver left, cancelled.
    cancelled: Vec<String>,
}

impl SlurmJobsPlacement {
    pub(super) fn new(file: &ExperimentFile) -> Result<Self, TuneError> {
        let jobs = file.cluster.jobs.clone();
        jobs.validate().map_err(|(key, why)| TuneError::Cluster(format!("{key}: {why}")))?;
        Ok(Self { jobs, answer: String::new(), cancelled: Vec::new() })
    }
}

impl Placement for SlurmJobsPlacement {
    fn check<'a>(&'a mut self, s: &'a Startup<'a>) -> BoxFuture<'a, Result<(), TuneError>> {
        async move {
            let file = s.file;
            file.cluster
                .check_reachable(file.trainer.as_ref().and_then(|t| t.report_bind), "the trials' Slurm jobs")
                .map_err(|e| TuneError::Cluster(e.0))?;
            // Where the report server can listen, told after what Slurm says of the job (a bad partition names no nodes).
            let report = super::cluster_report_server(file, &trainer::partition_node_addresses(self.jobs.partition.as_deref()));
            let bundles = ResourcePool::jobs(1).try_allocate(s.request).map(|a| a.workers).unwrap_or_default();
            // sbatch's test runs in the experiment's directory; one made for it goes again if Slurm says no.
            let made = !s.exp_dir.exists();
            std::fs::create_dir_all(s.exp_dir).map_err(|source| TuneError::Io { path: s.exp_dir.to_path_buf(), source })?;
            let answer = trainer::check_slurm_job(&self.jobs, &bundles, s.request.strategy, s.exp_dir).await;
            self.answer = answer.map_err(|e| {
                if made {
                    let _ = std::fs::remove_dir(s.exp_dir);
                }
                TuneError::Cluster(format!("Slurm would not take a trial's job as [cluster.jobs] describes it: {}", e.0))
            })?;
            if let Err(e) = report {
                if made {
                    let _ = std::fs::remove_dir(s.exp_dir);
                }
                return Err(e);
            }
            if s.resuming {
                let left = trainer::cancel_leftover_jobs(s.exp_dir).await.map_err(|e| TuneError::Cluster(e.0))?;
                self.cancelled = left.into_iter().map(|r| format!("{} ({})", r.id, r.name)).collect();
            }
            Ok(())
        }
        .boxed()
    }

    fn nodes(&self) -> Nodes {
        let j = &self.jobs;
        let mut what = vec![format!("at most {} at once", j.max_jobs)];
        for (k, v) in [("partition", &j.partition), ("account", &j.account), ("qos", &j.qos), ("time", &j.time)] {
            if let Some(v) = v {
                what.push(format!("{k} {v}"));
            }
        }
        let mut notes = Vec::new();
        if !self.answer.is_empty() {
            notes.push(format!(
                "nestor: Slurm on a trial's job: {}",
                self.answer.lines().last().unwrap_or_default().trim_start_matches("sbatch: ")
            ));
        }
        if !self.cancelled.is_empty() {
            notes.push(format!(
                "nestor: cancelled {} job(s) an earlier driver of this experiment left: {}; their trials go on from their latest checkpoints",
                self.cancelled.len(),
                self.cancelled.join(", ")
            ));
        }
        Nodes { pool: ResourcePool::jobs(j.max_jobs), description: format!("a Slurm job per trial run ({})", what.join(", ")), notes }
    }

    fn backend<'a>(self: Box<Self>, mut config: ProcessConfig, s: &'a Startup<'a>) -> BoxFuture<'a, Result<Launcher, TuneError>> {
        async move {
            let file = s.file;
            let (advertise, bind) = super::cluster_report_server(file, &trainer::partition_node_addresses(self.jobs.partition.as_deref()))?;
            config.report_bind = bind;
            let backend = SlurmJobsBackend::start(config, self.jobs, &advertise, s.exp_dir, s.request.strategy)
                .await
                .map_err(|source| TuneError::Io { path: "<report server>".into(), source })?;
            let notes = vec![format!("nestor: workers report to {}", backend.report_url())];
            Ok(Launcher { backend: Arc::new(backend), notes })
        }
        .boxed()
    }
}
