//! The Slurm commands the engines run, and what they read back: `srun`
//! for a step of the allocation (without the step-shaping options the
//! job's environment carries), `squeue`'s list of a job's steps, the names
//! of an experiment's steps, the CPUs a step asks per task. Both engines
//! and the step supervisor use them; they use nothing of the engines.

/// `srun` options a job's environment may carry that would change a
/// step's shape: the step is described by nestor's own options only.
const STEP_SHAPING: &[&str] = &[
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_NTASKS_PER_SOCKET",
    "SLURM_NTASKS_PER_CORE",
    "SLURM_NTASKS_PER_GPU",
    "SLURM_CPUS_PER_TASK",
    "SLURM_CPUS_PER_GPU",
    "SLURM_MEM_PER_NODE",
    "SLURM_MEM_PER_CPU",
    "SLURM_MEM_PER_GPU",
    "SLURM_NNODES",
    "SLURM_DISTRIBUTION",
    "SLURM_HOSTFILE",
    "SLURM_GPUS",
    "SLURM_GPUS_PER_NODE",
    "SLURM_GPUS_PER_TASK",
    "SLURM_GRES",
    "SLURM_TRES_PER_TASK",
    "SLURM_EXCLUSIVE",
    "SLURM_OVERLAP",
    "SLURM_EXACT",
];

/// `nestor-<experiment>-`: the names of the job steps of the experiment in `exp_dir` begin so.
pub(crate) fn step_prefix(exp_dir: &std::path::Path) -> String {
    format!("nestor-{}-", exp_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
}

/// A job step as `squeue` lists it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Listed {
    /// `job.step`.
    pub(super) id: String,
    pub(super) name: String,
    /// Its nodes, as a host list.
    pub(super) nodes: String,
}

/// `job`'s steps now; none when squeue cannot answer.
pub(super) async fn steps(job: &str) -> Vec<Listed> {
    let Ok(out) = tokio::process::Command::new("squeue").args(["-h", "-s", "-j", job, "-o", "%i|%j|%N"]).output().await else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, '|').map(str::trim);
            Some(Listed { id: f.next()?.to_string(), name: f.next()?.to_string(), nodes: f.next().unwrap_or_default().to_string() })
        })
        .collect()
}

/// An `srun` for a step of `job`, without the step-shaping options the
/// job's environment may carry.
pub(super) fn srun(job: &str) -> std::process::Command {
    let mut c = std::process::Command::new("srun");
    for k in STEP_SHAPING {
        c.env_remove(k);
    }
    c.arg(format!("--jobid={job}"));
    c
}

/// Whole CPUs a step asks Slurm for per task (Slurm's unit): its largest rank's, at least 1.
pub(super) fn cpus_per_task(bundles: &[crate::WorkerBundle]) -> u32 {
    bundles.iter().map(|b| b.cpus.ceil().max(1.0) as u32).max().unwrap_or(1)
}
