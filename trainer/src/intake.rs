//! One trial's report intake: the checks every rank's report goes through
//! and the persistence of its checkpoint shard, before the step aggregator
//! takes it. The gRPC service and in-process ranks both report through it,
//! so they accept and refuse the same reports with the same errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::aggregate::Aggregator;
use crate::backend::Directive;
use crate::checkpoint::{check_source, CheckpointError};
use crate::storage::Storage;

/// The longest metric name a report may carry.
pub(crate) const MAX_METRIC_NAME: usize = 256;

/// Why a report was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IntakeError {
    /// The report is wrong (a metric name, the rank, a step reported twice):
    /// the same report will never be taken.
    #[error("{0}")]
    Refused(String),
    /// Its checkpoint could not be taken: not a directory the worker may
    /// checkpoint from ([`CheckpointError::is_refusal`]), or storage failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// A rank's checkpoint shard for one report.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shard<'a> {
    /// A directory of the worker's own (checked against the roots workers
    /// may checkpoint from), copied into the trial's storage.
    Dir(&'a Path),
    /// A copy already made below the trial's staging directory (by the rank
    /// itself, or from shipped chunks): moved into place, not copied.
    Staged(&'a Path),
    /// The checkpoint URI below which the rank uploaded its shard itself:
    /// checked to be there, then recorded.
    Uploaded(&'a str),
}

/// A trial's intake: where its checkpoint shards go, where workers may
/// checkpoint from, and the aggregator of its steps.
#[derive(Debug)]
pub(crate) struct Intake {
    storage: Storage,
    roots: Roots,
    aggregator: Arc<Aggregator>,
}

/// Where workers may checkpoint from: given, or worked out from the run's
/// launch when its first checkpoint comes (most runs of a short trial
/// never checkpoint, and the working directory is a system call).
#[derive(Debug)]
enum Roots {
    Given(Vec<PathBuf>),
    OfLaunch { trial_dir: PathBuf, extra: Vec<PathBuf>, made: std::sync::OnceLock<Vec<PathBuf>> },
}

impl Roots {
    fn get(&self) -> &[PathBuf] {
        match self {
            Roots::Given(roots) => roots,
            Roots::OfLaunch { trial_dir, extra, made } => made.get_or_init(|| crate::checkpoint::roots(trial_dir, None, extra)),
        }
    }
}

impl Intake {
    pub(crate) fn new(storage: Storage, roots: Vec<PathBuf>, aggregator: Arc<Aggregator>) -> Self {
        Self { storage, roots: Roots::Given(roots), aggregator }
    }

    /// The intake of an in-process run of `spec`: its ranks checkpoint from
    /// what [`crate::LaunchSpec::roots`] names, with the driver's working directory.
    pub(crate) fn in_process(spec: &crate::LaunchSpec, aggregator: Arc<Aggregator>) -> Self {
        let roots =
            Roots::OfLaunch { trial_dir: spec.trial_dir.clone(), extra: spec.checkpoint_roots.clone(), made: std::sync::OnceLock::new() };
        Self { storage: spec.storage.clone(), roots, aggregator }
    }

    /// The trial's step aggregator.
    pub(crate) fn aggregator(&self) -> &Arc<Aggregator> {
        &self.aggregator
    }

    /// Takes `rank`'s next report: checks its metric names, persists its
    /// checkpoint shard (if any) under the step's checkpoint, and hands it to
    /// the aggregator. Returns the step's iteration and where the driver's
    /// decision on it arrives.
    pub(crate) async fn submit(
        &self,
        rank: u32,
        metrics: BTreeMap<String, f64>,
        extra: Option<serde_json::Value>,
        checkpoint: Option<Shard<'_>>,
    ) -> Result<(u64, oneshot::Receiver<Directive>), IntakeError> {
        if let Some(bad) = metrics.keys().find(|k| k.is_empty() || k.len() > MAX_METRIC_NAME) {
            return Err(IntakeError::Refused(format!("invalid metric name {bad:?}")));
        }
        let refused = |e: crate::aggregate::ArriveError| IntakeError::Refused(e.to_string());
        let iteration = self.aggregator.next_iteration(rank).map_err(refused)?;
        if let Some(shard) = &checkpoint {
            let how = match shard {
                Shard::Dir(_) => "copied by the driver",
                Shard::Staged(_) => "staged by the rank, moved by the driver",
                Shard::Uploaded(_) => "uploaded by the rank",
            };
            tracing::debug!(rank, iteration, how, "checkpoint shard");
        }
        let checkpoint = match checkpoint {
            Some(Shard::Dir(dir)) => {
                let src = check_source(dir, self.roots.get())?;
                Some(self.storage.upload_shard(&src, iteration, rank).await?)
            }
            Some(Shard::Staged(dir)) => Some(self.storage.adopt_shard(dir, iteration, rank).await?),
            Some(Shard::Uploaded(uri)) => Some(self.storage.check_uploaded(uri, iteration, rank).await?),
            None => None,
        };
        let rx = self.aggregator.arrive(rank, iteration, metrics, extra, checkpoint).map_err(refused)?;
        Ok((iteration, rx))
    }
}
