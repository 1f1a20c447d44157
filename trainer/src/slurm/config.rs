//! `[cluster.jobs]`: how trial runs are submitted as Slurm jobs of their
//! own (`[cluster] backend = "slurm_jobs"`), and its checks.

use serde::{Deserialize, Serialize};

/// `[cluster.jobs]`: each trial run (a start, a restart, a resume after a
/// pause) as a Slurm job of its own, its ranks the tasks of one job step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmJobsConfig {
    /// `--partition`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// `--account`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// `--qos`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// Each job's time limit, in Slurm's form (`90`, `4:00:00`, `1-12:00:00`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// More `sbatch` options, each as one word (`"--constraint=a100"`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sbatch: Vec<String>,
    /// The most jobs queued or running at once (the sweep's share of the queue).
    #[serde(default = "default_max_jobs")]
    pub max_jobs: usize,
    /// Seconds before a job's time limit that its ranks get SIGUSR1 (`--signal`):
    /// `nestor.train.get_preemption_info()` says so and the trial checkpoints.
    /// 0: no signal.
    #[serde(default = "default_signal_s")]
    pub signal_s: u64,
    /// Seconds between two readings of the jobs' states (one `squeue` call
    /// for all of them).
    #[serde(default = "default_poll_s")]
    pub poll_s: f64,
}

fn default_max_jobs() -> usize {
    16
}

fn default_signal_s() -> u64 {
    120
}

fn default_poll_s() -> f64 {
    10.0
}

impl Default for SlurmJobsConfig {
    fn default() -> Self {
        Self {
            partition: None,
            account: None,
            qos: None,
            time: None,
            sbatch: Vec::new(),
            max_jobs: default_max_jobs(),
            signal_s: default_signal_s(),
            poll_s: default_poll_s(),
        }
    }
}

/// `sbatch` options nestor sets itself for each job: given in
/// `[cluster.jobs] sbatch`, they would change what the driver relies on.
const OWN_OPTIONS: &[&str] = &[
    "--job-name",
    "-J",
    "--output",
    "-o",
    "--error",
    "-e",
    "--open-mode",
    "--ntasks",
    "-n",
    "--cpus-per-task",
    "-c",
    "--gpus-per-task",
    "--mem-per-cpu",
    "--signal",
    "--array",
    "-a",
    "--wrap",
    "--parsable",
    "--export",
    "--requeue",
    "--no-requeue",
    "--partition",
    "-p",
    "--account",
    "-A",
    "--qos",
    "-q",
    "--time",
    "-t",
];

impl SlurmJobsConfig {
    /// Whether it is all defaults.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Refuses what cannot work, naming the key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.max_jobs == 0 {
            return Err(("cluster.jobs.max_jobs".into(), "must be at least 1".into()));
        }
        if !(self.poll_s.is_finite() && self.poll_s >= 0.1) {
            return Err(("cluster.jobs.poll_s".into(), format!("must be at least 0.1 (seconds), got {}", self.poll_s)));
        }
        for (key, v) in [("partition", &self.partition), ("account", &self.account), ("qos", &self.qos), ("time", &self.time)] {
            if let Some(v) = v.as_deref().filter(|v| v.trim().is_empty() || v.contains(char::is_whitespace)) {
                return Err((format!("cluster.jobs.{key}"), format!("{v:?} is not one word")));
            }
        }
        for o in &self.sbatch {
            let name = o.split_once('=').map_or(o.as_str(), |(n, _)| n);
            if !o.starts_with('-') {
                return Err((
                    "cluster.jobs.sbatch".into(),
                    format!("{o:?} is not an option (give each as one word: \"--constraint=a100\")"),
                ));
            }
            if OWN_OPTIONS.contains(&name)
                || OWN_OPTIONS.iter().any(|own| own.len() == 2 && name.starts_with(own) && name.len() > 2 && !name.starts_with("--"))
            {
                let keyed = ["--partition", "-p", "--account", "-A", "--qos", "-q", "--time", "-t"];
                let hint =
                    if keyed.contains(&name) { " (it has a key of its own in [cluster.jobs])" } else { " (nestor sets it for each job)" };
                return Err(("cluster.jobs.sbatch".into(), format!("{o:?}: nestor does not take this option here{hint}")));
            }
        }
        Ok(())
    }
}
