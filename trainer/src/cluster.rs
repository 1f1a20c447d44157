//! The `[cluster]` section of an experiment file: where trials run — this
//! machine, or the nodes of the Slurm allocation nestor runs inside.

use serde::{Deserialize, Serialize};

use crate::slurm::{SlurmAllocation, SlurmError};

/// Which engine runs the trials.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterBackend {
    /// Slurm inside an allocation (`SLURM_JOB_ID` set), else this machine.
    #[default]
    Auto,
    /// This machine, even inside an allocation.
    Local,
    /// The Slurm allocation nestor runs inside (an error outside one).
    Slurm,
}

/// `[cluster]`: which engine runs the trials and where their workers report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// `auto` (default), `local` or `slurm`.
    #[serde(default)]
    pub backend: ClusterBackend,
    /// The address the nodes reach the driver at (`host` or `host:port`);
    /// default: this machine's host name, on a free port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_address: Option<String>,
}

impl ClusterConfig {
    /// Whether it is all defaults (left out of a written file).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The allocation to run in: `None` for this machine.
    pub fn allocation(&self) -> Result<Option<SlurmAllocation>, SlurmError> {
        match self.backend {
            ClusterBackend::Local => Ok(None),
            ClusterBackend::Auto => SlurmAllocation::from_env(),
            ClusterBackend::Slurm => SlurmAllocation::from_env()?.map(Some).ok_or_else(|| {
                SlurmError(
                    "cluster.backend = \"slurm\" but nestor is not inside a Slurm allocation (no SLURM_JOB_ID): \
                     run it under salloc or sbatch, or use `nestor submit`"
                        .into(),
                )
            }),
        }
    }
}
