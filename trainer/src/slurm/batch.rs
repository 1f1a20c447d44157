//! Trials as Slurm jobs of their own: each run of a trial (a start, a
//! restart, a resume after a pause) is one `sbatch` job whose one step
//! holds the trial's ranks, submitted from wherever the driver runs (a
//! login node). The ranks get the worker contract they get inside an
//! allocation (the same variables, the same report channel); what differs
//! is who picks the nodes (Slurm, when the job starts) and how the driver
//! follows the run:
//!
//! - states: one `squeue` call per interval for every job of the
//!   experiment (`board.rs`), whatever their number, so a sweep of hundreds
//!   of queued jobs costs `slurmctld` one call per interval;
//! - output: the job writes srun's labelled lines to one file in the
//!   trial's `logs/`, which the driver reads as it grows (`job.rs`: one
//!   run's supervisor) and splits into
//!   `rank-<r>.log` and `job.log`. A job whose node does not see that file
//!   (no directory shared with the driver) sends them to the driver
//!   instead (`nestor relay-output`, the report channel's `JobOutput`),
//!   and its ranks ship their checkpoint shards through the driver and
//!   meet through it, as ranks on such nodes inside an allocation do;
//! - the end: the job's final state says how it ended ([`JobEnd`]): its
//!   ranks finished, its code failed (the failed rank named from srun's
//!   lines), out of memory, or the cluster ended it (preempted, out of
//!   time, a node lost: the run goes on from its latest checkpoint, not
//!   charged to `max_failures`).
//!
//! A job Slurm puts back in its queue (`scontrol requeue`, preemption in
//! requeue mode) is cancelled and the run ends as the cluster's doing: the
//! loop starts a new job from the latest checkpoint, at once, where a
//! requeued job would wait about two minutes (its `BeginTime`) and start
//! from the checkpoint it was submitted with. The batch script refuses to
//! run a requeued job's ranks again for the same reason.
//!
//! Time limits: `--signal=USR1@<s>` gives every rank SIGUSR1 that long
//! before the job's limit; nestor's Python ranks then answer
//! `nestor.train.get_preemption_info()`, so the trial saves a checkpoint
//! before it is ended.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::board::Board;
use super::commands::cpus_per_task;
use super::config::SlurmJobsConfig;
use super::job::{JobRun, Said, STEP_EXIT, UNSHARED};
use super::jobs::{JobRow, JobWatch};
use super::output::StepWatch;
use super::submit::sh_quote;
use crate::backend::{Backend, Event, LaunchError, LaunchSpec, StepProgress, TrialHandle};
use crate::command::ProcessConfig;
use crate::contract::{NodeView, Preemption, RunPlan};
use crate::process::{common_env, free_port, plan_settings, ReportTo};
use crate::scaling::PlacementStrategy;
use crate::service::ReportServer;
use crate::supervise::{supervise, Escalation, Groups};
use crate::token::random_token;

/// Run by each rank before the worker, inside the job: its place from
/// Slurm's task variables.
const PROLOGUE: &str = r#"r=${SLURM_PROCID:?not a Slurm task}
RANK=$r; WORLD_SIZE=$SLURM_NTASKS; LOCAL_RANK=${SLURM_LOCALID:-0}; NODE_RANK=${SLURM_NODEID:-0}; GROUP_RANK=$NODE_RANK
LOCAL_WORLD_SIZE=1; i=0
for part in $(printf '%s' "${SLURM_STEP_TASKS_PER_NODE:-1}" | tr ',' ' '); do
  n=${part%%(*}; k=1
  case $part in *'(x'*) k=${part#*(x}; k=${k%)};; esac
  if [ "$NODE_RANK" -lt $((i + k)) ]; then LOCAL_WORLD_SIZE=$n; break; fi
  i=$((i + k))
done
OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
MASTER_ADDR=${NESTOR_MASTER_ADDR:-${SLURM_LAUNCH_NODE_IPADDR:-$(hostname)}}
export RANK WORLD_SIZE LOCAL_RANK NODE_RANK GROUP_RANK LOCAL_WORLD_SIZE OMP_NUM_THREADS MASTER_ADDR
if [ -z "$NESTOR_GPUS_FROM_SLURM" ]; then unset CUDA_VISIBLE_DEVICES
elif [ -n "$NESTOR_GPU_SAMPLER" ] && [ "$LOCAL_RANK" = 0 ]; then
  gs=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-$CUDA_VISIBLE_DEVICES}}
  if [ -n "$gs" ]; then "$NESTOR_GPU_SAMPLER" gpu-sample --gpus "$gs" </dev/null >/dev/null 2>&1 & fi
fi
unset NESTOR_GPUS_FROM_SLURM NESTOR_MASTER_ADDR NESTOR_GPU_SAMPLER
g=; if [ -n "$CUDA_VISIBLE_DEVICES" ]; then g=", GPUs $CUDA_VISIBLE_DEVICES"; fi
echo "nestor: rank $r of $WORLD_SIZE on $SLURMD_NODENAME (node rank $NODE_RANK, local rank $LOCAL_RANK$g)" >&2
exec "$@""#;

/// Launches each trial run as a Slurm job of its own.
#[derive(Debug, Clone)]
pub struct SlurmJobsBackend {
    config: Arc<ProcessConfig>,
    server: Arc<ReportServer>,
    jobs: Arc<SlurmJobsConfig>,
    /// What workers are told to report to (`NESTOR_ADDR`).
    report_url: String,
    /// `nestor-<experiment>-`: every job of the experiment is named so.
    prefix: String,
    board: Arc<Board>,
    /// How a trial's ranks spread over its job's nodes.
    strategy: PlacementStrategy,
    /// The experiment's directory, and whether the driver has said that a
    /// job ran on a node that does not see it (said once).
    unshared: Arc<(PathBuf, AtomicBool)>,
}

impl SlurmJobsBackend {
    /// Starts the report server on `config.report_bind`, workers reporting
    /// to `advertise` (`host` or `host:port`), for the experiment in
    /// `exp_dir`, each trial's ranks spread over its job's nodes as
    /// `strategy` says. Must be called inside a tokio runtime.
    pub async fn start(
        config: ProcessConfig,
        jobs: SlurmJobsConfig,
        advertise: &str,
        exp_dir: &Path,
        strategy: PlacementStrategy,
    ) -> std::io::Result<Self> {
        let server = ReportServer::start_encrypted(config.report_bind).await?;
        server.serve_files(&config.files);
        let port = server.addr().port();
        let scheme = server.scheme();
        let report_url = if advertise.contains(':') { format!("{scheme}://{advertise}") } else { format!("{scheme}://{advertise}:{port}") };
        let prefix = super::commands::step_prefix(exp_dir);
        let board = Board::start(prefix.clone(), Duration::from_secs_f64(jobs.poll_s));
        Ok(Self {
            config: Arc::new(config),
            server: Arc::new(server),
            jobs: Arc::new(jobs),
            report_url,
            prefix,
            board,
            strategy,
            unshared: Arc::new((std::path::absolute(exp_dir)?, AtomicBool::new(false))),
        })
    }

    /// The URL workers report to.
    pub fn report_url(&self) -> &str {
        &self.report_url
    }

    /// How many times nestor has called the Slurm controller (`squeue`,
    /// `sbatch`, `scancel`) for this experiment's jobs.
    pub fn controller_calls(&self) -> u64 {
        self.board.calls.load(Ordering::Relaxed)
    }
}

/// How a job's ranks are spread over its nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spread {
    /// As Slurm packs them.
    Any,
    /// All on one node.
    OneNode,
    /// Each on a node of its own.
    NodeEach,
}

impl Spread {
    /// How `ranks` ranks placed with `strategy` spread.
    fn of(ranks: usize, strategy: PlacementStrategy) -> Self {
        match (ranks, strategy) {
            (0 | 1, _) => Self::Any,
            (_, PlacementStrategy::StrictPack) => Self::OneNode,
            (_, PlacementStrategy::StrictSpread) => Self::NodeEach,
            _ => Self::Any,
        }
    }
}

/// `sbatch`'s options for one run: its name, its ranks' shape (whole CPUs
/// and GPUs per task, memory per CPU when asked), the signal before its
/// time limit, and `[cluster.jobs]`'s own. Its output goes where its batch
/// script sends it (Slurm would fail a job whose output file its node
/// cannot open, and the trial's directory may be one it cannot see).
pub(crate) fn job_args(jobs: &SlurmJobsConfig, name: &str, bundles: &[crate::WorkerBundle], spread: Spread) -> Vec<String> {
    let cpus = cpus_per_task(bundles);
    let mut args = vec![
        "--parsable".to_string(),
        format!("--job-name={name}"),
        "--output=/dev/null".into(),
        format!("--ntasks={}", bundles.len().max(1)),
        format!("--cpus-per-task={cpus}"),
        // Slurm may put it back in its queue (preemption, an operator); the driver then starts a new one.
        "--requeue".into(),
        "--export=ALL".into(),
    ];
    let memory = bundles.iter().map(|b| b.memory_bytes).fold(0.0, f64::max);
    if memory > 0.0 {
        args.push(format!("--mem-per-cpu={}", (memory / f64::from(cpus) / 1_048_576.0).ceil().max(1.0) as u64));
    }
    let gpus = bundles.iter().map(|b| b.gpus.len()).max().unwrap_or(0);
    if gpus > 0 {
        args.push(format!("--gpus-per-task={gpus}"));
    }
    match spread {
        Spread::Any => {}
        Spread::OneNode => args.push("--nodes=1".into()),
        Spread::NodeEach => args.push("--ntasks-per-node=1".into()),
    }
    if jobs.signal_s > 0 {
        args.push(format!("--signal=USR1@{}", jobs.signal_s));
    }
    for (flag, value) in [("partition", &jobs.partition), ("account", &jobs.account), ("qos", &jobs.qos), ("time", &jobs.time)] {
        if let Some(v) = value {
            args.push(format!("--{flag}={v}"));
        }
    }
    args.extend(jobs.sbatch.iter().cloned());
    args
}

/// The batch script of a run: its ranks as one job step, `command` after
/// the prologue; a requeued job runs nothing (the driver starts the trial
/// again from its latest checkpoint as a new job). Slurm's notice before
/// the time limit (SIGUSR1) reaches every process of the job's steps, srun
/// too, which would die of it: srun ignores it, the ranks record it.
///
/// Its output goes to the file the driver made for it
/// (`NESTOR_JOB_OUTPUT`) when this node sees it; else to the driver
/// through `nestor relay-output` (`NESTOR_RELAY`). The ranks make the
/// same test for their routes: the plan's probe is that file.
pub(crate) fn batch_script(command: &[String], gpus: bool) -> String {
    let words: Vec<String> = command.iter().map(|w| sh_quote(w)).collect();
    let gres = if gpus { "" } else { " --gres=none" };
    format!(
        "#!/bin/sh\n\
         relay=\n\
         if [ -f \"$NESTOR_JOB_OUTPUT\" ]; then\n  \
           exec >>\"$NESTOR_JOB_OUTPUT\" 2>&1\n\
         else\n  \
           if [ -n \"$NESTOR_RELAY\" ] && d=$(mktemp -d) && mkfifo \"$d/out\"; then\n    \
             \"$NESTOR_RELAY\" relay-output <\"$d/out\" >/dev/null 2>&1 &\n    \
             relay=$!\n    \
             exec >\"$d/out\" 2>&1\n    \
             rm -rf \"$d\"\n  \
           else\n    \
             exec >/dev/null 2>&1\n  \
           fi\n  \
           echo \"{UNSHARED}${{SLURMD_NODENAME:-$(hostname)}}: the job's output and its ranks' checkpoints go through the driver\"\n\
         fi\n\
         unset NESTOR_RELAY\n\
         finish() {{\n  \
           if [ -n \"$relay\" ]; then exec >/dev/null 2>&1; wait \"$relay\"; fi\n  \
           exit \"$1\"\n\
         }}\n\
         if [ \"${{SLURM_RESTART_COUNT:-0}}\" != 0 ]; then\n  \
           echo \"nestor: job $SLURM_JOB_ID was put back in the queue; this run ends and the trial goes on in a new job\" >&2\n  \
           finish 0\n\
         fi\n\
         trap '' USR1\n\
         srun --label --kill-on-bad-exit=1 --export=ALL --distribution=block{gres} /bin/sh -c {prologue} nestor-rank {words}\n\
         rc=$?\n\
         echo \"{STEP_EXIT}$rc\" >&2\n\
         finish $rc\n",
        prologue = sh_quote(PROLOGUE),
        words = words.join(" "),
    )
}

/// Variables of the driver's environment a job must not inherit: an
/// allocation the driver runs in is not the job's.
fn inherited_slurm_vars() -> Vec<String> {
    std::env::vars().map(|(k, _)| k).filter(|k| (k.starts_with("SLURM_") || k.starts_with("SBATCH_")) && k != "SLURM_CONF").collect()
}

impl Backend for SlurmJobsBackend {
    /// Ranks restore from the store themselves; one whose node cannot
    /// reach it gets its shard from the driver, which downloads the
    /// checkpoint then (once for every such rank).
    fn restores_from_store(&self) -> bool {
        crate::process::ranks_reach_store()
    }

    fn launch(&self, spec: LaunchSpec, events: mpsc::UnboundedSender<Event>) -> Result<TrialHandle, LaunchError> {
        let cfg = &self.config;
        let logs = spec.trial_dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|source| LaunchError::Io { path: logs.clone(), source })?;
        let world = spec.world_size();
        let bundles: Vec<_> = (0..world).map(|r| spec.bundle(r)).collect();
        let token = random_token();
        let key = crate::token::run_key();
        let name = format!("{}{}-{}", self.prefix, spec.trial_id, &key);
        let output = logs.join(format!("job-{}.out", &key));
        let rendezvous = logs.join(format!(".rendezvous-{key}"));
        // The job writes its output here when its node sees it (the batch
        // script looks for it); else it relays to the driver, and its ranks
        // take the routes without the experiment's directory.
        let view = NodeView::Unknown { probe: output.clone() };
        let mut settings =
            plan_settings(cfg, &spec, ReportTo { url: &self.report_url, ca: self.server.ca_pem() }, Some(rendezvous.as_path()));
        if self.jobs.signal_s > 0 {
            // Ranks record SIGUSR1 (get_preemption_info) instead of dying of it.
            settings.preemption = Some(Preemption { signal: "USR1".into(), notice_s: self.jobs.signal_s });
        }
        let plan = RunPlan::new(settings, &view);
        let mut env: Vec<(String, String)> = cfg.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        // MASTER_ADDR is the job's first node, known once it runs (the prologue sets it).
        env.extend(common_env(cfg, &plan, &token, "", free_port()));
        let gpus = bundles.iter().any(|b| !b.gpus.is_empty());
        if gpus {
            env.push(("NESTOR_GPUS_FROM_SLURM".into(), "1".into()));
            // A GPU sampler beside each node's first rank, where the nodes can run this binary.
            if let Some(binary) = crate::process::nestor_binary() {
                env.push(("NESTOR_GPU_SAMPLER".into(), binary));
            }
        }
        let spread = Spread::of(bundles.len(), self.strategy);
        let args = job_args(&self.jobs, &name, &bundles, spread);
        std::fs::write(&output, b"").map_err(|source| LaunchError::Io { path: output.clone(), source })?;
        env.push(("NESTOR_JOB_OUTPUT".into(), output.display().to_string()));
        if let Some(relay) = crate::process::nestor_binary() {
            env.push(("NESTOR_RELAY".into(), relay));
        }
        let script = batch_script(&cfg.command, gpus);
        let (log_paths, rank_files, job_log, job_file) = super::output::open_logs(&logs, world, "job.log")?;
        let roots = spec.roots(cfg.working_dir.as_deref());
        let mut registration = self.server.register(&spec, token, roots, events.clone());
        let relayed = registration.take_output().unwrap_or_else(|| mpsc::channel(1).1);
        let (handle, stop) = TrialHandle::new(Vec::new(), Some(Arc::clone(registration.aggregator()) as Arc<dyn StepProgress>));
        let started = Arc::new(AtomicBool::new(false));
        let handle = handle.started_by(Arc::clone(&started));
        let mut sbatch = tokio::process::Command::new("sbatch");
        for k in inherited_slurm_vars() {
            sbatch.env_remove(k);
        }
        sbatch.args(&args).envs(env).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        if let Some(dir) = &cfg.working_dir {
            sbatch.current_dir(dir);
        }
        let run = JobRun {
            trial_id: spec.trial_id.clone(),
            name,
            sbatch,
            script,
            output,
            relayed,
            unshared: Arc::clone(&self.unshared),
            watch: StepWatch::new(rank_files, job_file, started),
            stopping: Escalation::new(stop, cfg.grace_period),
            log_paths,
            job_log,
            rendezvous,
            registration,
            board: Arc::clone(&self.board),
            world,
            begins_later: args.iter().any(|a| a == "-b" || a.starts_with("--begin")),
            said: Said::new(world),
        };
        let groups: Groups = Arc::new(std::sync::Mutex::new(Vec::new()));
        supervise(spec.trial_id, events, groups, libc::SIGTERM, run.run());
        Ok(handle)
    }
}

/// Asks Slurm whether it would take a job of one run with `bundles` (one
/// per rank) as `[cluster.jobs]` describes it (`sbatch --test-only`: nothing
/// is queued); Slurm's answer (when and where it would start it), or its refusal.
pub async fn check_job(
    jobs: &SlurmJobsConfig,
    bundles: &[crate::WorkerBundle],
    strategy: PlacementStrategy,
    exp_dir: &Path,
) -> Result<String, super::SlurmError> {
    let spread = Spread::of(bundles.len(), strategy);
    let name = format!("{}check", super::commands::step_prefix(exp_dir));
    let mut args = job_args(jobs, &name, bundles, spread);
    args.retain(|a| a != "--parsable");
    args.push("--test-only".into());
    let mut c = tokio::process::Command::new("sbatch");
    for k in inherited_slurm_vars() {
        c.env_remove(k);
    }
    let mut child = c
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| super::SlurmError(format!("cannot run sbatch: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"#!/bin/sh\ntrue\n").await;
    }
    let out = child.wait_with_output().await.map_err(|e| super::SlurmError(format!("sbatch: {e}")))?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)).trim().to_string();
    if out.status.success() {
        Ok(said)
    } else {
        Err(super::SlurmError(format!("sbatch --test-only {}: {said}", args.join(" "))))
    }
}

/// The jobs of the experiment in `exp_dir` Slurm lists as queued or
/// running (an earlier driver's), cancelled; their ids.
pub async fn cancel_leftover_jobs(exp_dir: &Path) -> Result<Vec<JobRow>, super::SlurmError> {
    let mut watch = JobWatch::new(super::commands::step_prefix(exp_dir), Duration::ZERO);
    let left: Vec<JobRow> = watch.jobs().await?.values().filter(|r| r.state.end().is_none()).cloned().collect();
    if left.is_empty() {
        return Ok(left);
    }
    let ids: Vec<&str> = left.iter().map(|r| r.id.as_str()).collect();
    let out = tokio::process::Command::new("scancel")
        .args(&ids)
        .output()
        .await
        .map_err(|e| super::SlurmError(format!("cannot run scancel: {e}")))?;
    if !out.status.success() {
        return Err(super::SlurmError(format!("scancel {}: {}", ids.join(" "), String::from_utf8_lossy(&out.stderr).trim())));
    }
    // Gone from the queue before the sweep goes on, so no report of theirs comes late.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        let jobs = watch.jobs().await?;
        if left.iter().all(|r| jobs.get(&r.id).is_none_or(|j| j.state.end().is_some())) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_jobs_options_give_its_ranks_shape_and_the_configs_own() {
        let jobs = SlurmJobsConfig {
            partition: Some("gpu".into()),
            time: Some("4:00:00".into()),
            sbatch: vec!["--constraint=a100".into()],
            signal_s: 90,
            ..SlurmJobsConfig::default()
        };
        let rank = |cpus: f64, gpus: u32, memory: f64| crate::WorkerBundle {
            gpus: (0..gpus).collect(),
            gpu_share: if gpus > 0 { 1.0 } else { 0.0 },
            memory_bytes: memory,
            ..crate::WorkerBundle::cpus(cpus)
        };
        let bundles = [rank(1.5, 2, 3.0 * 1_048_576.0 * 1024.0), rank(1.0, 2, 0.0)];
        let args = job_args(&jobs, "nestor-e-trial_00001-abcd", &bundles, Spread::NodeEach);
        for want in [
            "--parsable",
            "--job-name=nestor-e-trial_00001-abcd",
            "--output=/dev/null",
            "--ntasks=2",
            "--cpus-per-task=2",
            "--mem-per-cpu=1536",
            "--gpus-per-task=2",
            "--ntasks-per-node=1",
            "--signal=USR1@90",
            "--partition=gpu",
            "--time=4:00:00",
            "--constraint=a100",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        assert!(!args.iter().any(|a| a.starts_with("--account") || a.starts_with("--qos")), "{args:?}");
        let none = SlurmJobsConfig { signal_s: 0, ..SlurmJobsConfig::default() };
        let args = job_args(&none, "n", &[rank(1.0, 0, 0.0)], Spread::Any);
        assert!(!args.iter().any(|a| a.starts_with("--signal") || a.starts_with("--gpus") || a.starts_with("--mem")), "{args:?}");
        assert_eq!(Spread::of(4, PlacementStrategy::StrictPack), Spread::OneNode);
        assert_eq!(Spread::of(1, PlacementStrategy::StrictSpread), Spread::Any);
    }

    #[test]
    fn the_batch_script_guards_a_requeue_and_quotes_the_command() {
        let script = batch_script(&["python".into(), "train it.py".into(), "--lr=it's".into()], false);
        assert!(script.starts_with("#!/bin/sh\n"));
        let guard = script.find("SLURM_RESTART_COUNT").unwrap();
        let srun = script.find("srun --label").unwrap();
        assert!(guard < srun, "the requeue guard comes first");
        assert!(script.contains("trap '' USR1\nsrun"), "srun ignores the notice meant for the ranks:\n{script}");
        assert!(script.contains("--gres=none"), "a CPU trial asks for no GPU");
        assert!(script.contains(r#"nestor-rank python 'train it.py' '--lr=it'\''s'"#), "{script}");
        assert!(script.contains(STEP_EXIT));
        assert!(!batch_script(&["x".into()], true).contains("--gres=none"));
    }
}
