//! Trials as Slurm jobs of their own: each run of a trial (a start, a
//! restart, a resume after a pause) is one `sbatch` job whose one step
//! holds the trial's ranks, submitted from wherever the driver runs (a
//! login node). The ranks get the worker contract they get inside an
//! allocation (the same variables, the same report channel); what differs
//! is who picks the nodes (Slurm, when the job starts) and how the driver
//! follows the run:
//!
//! - states: one `squeue` call per interval for every job of the
//!   experiment ([`Board`]), whatever their number, so a sweep of hundreds
//!   of queued jobs costs `slurmctld` one call per interval;
//! - output: the job writes srun's labelled lines to one file in the
//!   trial's `logs/`, which the driver reads as it grows and splits into
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

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};

use super::commands::cpus_per_task;
use super::config::SlurmJobsConfig;
use super::jobs::{JobEnd, JobRow, JobState, JobWatch};
use super::output::{step_outcome, StepEnd, StepWatch};
use super::submit::sh_quote;
use crate::backend::{Backend, Event, ExitOutcome, LaunchError, LaunchSpec, StepProgress, StopLevel, TrialHandle};
use crate::contract::{NodeView, Preemption, RunPlan};
use crate::process::{common_env, free_port, log_tail, plan_settings, ProcessConfig, ReportTo};
use crate::scaling::PlacementStrategy;
use crate::service::{Registration, ReportServer};
use crate::supervise::{supervise, Escalation, Groups, StopStep};
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
if [ -z "$NESTOR_GPUS_FROM_SLURM" ]; then unset CUDA_VISIBLE_DEVICES; fi
unset NESTOR_GPUS_FROM_SLURM NESTOR_MASTER_ADDR
g=; if [ -n "$CUDA_VISIBLE_DEVICES" ]; then g=", GPUs $CUDA_VISIBLE_DEVICES"; fi
echo "nestor: rank $r of $WORLD_SIZE on $SLURMD_NODENAME (node rank $NODE_RANK, local rank $LOCAL_RANK$g)" >&2
exec "$@""#;

/// The line the batch script ends with: the ranks' step's exit code.
const STEP_EXIT: &str = "nestor: the ranks' job step exited with code ";

/// The batch script's first line on a node that does not see the trial's
/// directory, before the node's name.
const UNSHARED: &str = "nestor: the experiment's directory is not visible on ";

/// How long a run may wait for Slurm to list a job it just accepted.
const LISTED_WITHIN: Duration = Duration::from_secs(60);

/// A pause before a run whose job Slurm would not take ends (the loop then
/// starts it again): the controller is busy, or a limit of the queue is reached.
const SUBMIT_BACKOFF: Duration = Duration::from_secs(5);

/// The latest reading of the experiment's jobs, for every run to look up its own.
#[derive(Debug, Clone, Default)]
struct Reading {
    /// The experiment's jobs by id.
    jobs: Arc<BTreeMap<String, JobRow>>,
    /// Why the last call failed (the reading before it stands).
    error: Option<String>,
}

/// Reads the states of the experiment's jobs in one `squeue` call every
/// interval while any run follows one, and hands each reading to all of
/// them; counts the calls nestor makes to the controller.
#[derive(Debug)]
struct Board {
    readings: watch::Sender<Reading>,
    /// Wakes the reader at once (a job was submitted, a stop was asked).
    poke: Arc<tokio::sync::Notify>,
    /// Calls to `slurmctld`: `squeue`, `sbatch`, `scancel`.
    calls: AtomicU64,
}

impl Board {
    fn start(prefix: String, interval: Duration) -> Arc<Self> {
        let (readings, _) = watch::channel(Reading::default());
        let board = Arc::new(Self { readings, poke: Arc::default(), calls: AtomicU64::new(0) });
        let weak = Arc::downgrade(&board);
        tokio::spawn(async move {
            let mut watch = JobWatch::new(prefix, interval / 5);
            // squeue calls already in `calls`.
            let mut counted = 0;
            loop {
                let Some(board) = weak.upgrade() else { return };
                if board.readings.receiver_count() > 0 {
                    let reading = match watch.jobs().await {
                        Ok(jobs) => Reading { jobs: Arc::new(jobs.clone()), error: None },
                        Err(e) => Reading { jobs: Arc::clone(&board.readings.borrow().jobs), error: Some(e.0) },
                    };
                    board.calls.fetch_add(watch.calls() - counted, Ordering::Relaxed);
                    counted = watch.calls();
                    board.readings.send_replace(reading);
                }
                let poke = Arc::clone(&board.poke);
                drop(board);
                let poked = poke.notified();
                // The next reading: after the interval, or sooner when poked (a job submitted or
                // cancelled), but never two within a fifth of it (JobWatch answers from its last then).
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = poked => tokio::time::sleep(interval / 5).await,
                }
            }
        });
        board
    }

    fn count_call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

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
            offset: 0,
            relayed,
            unshared: Arc::clone(&self.unshared),
            pending: String::new(),
            watch: StepWatch::new(rank_files, job_file, started),
            stopping: Escalation::new(stop, cfg.grace_period),
            log_paths,
            job_log,
            rendezvous,
            registration,
            board: Arc::clone(&self.board),
            world,
            step_exit: None,
            requeue_seen: false,
            begins_later: args.iter().any(|a| a == "-b" || a.starts_with("--begin")),
            heard: false,
            rank_nodes: vec![String::new(); world as usize],
        };
        let groups: Groups = Arc::new(std::sync::Mutex::new(Vec::new()));
        supervise(spec.trial_id, events, groups, libc::SIGTERM, run.run());
        Ok(handle)
    }
}

/// One run as a Slurm job, from its submission to its end.
struct JobRun {
    trial_id: String,
    /// The job's name (`nestor-<experiment>-<trial>-<token>`).
    name: String,
    sbatch: tokio::process::Command,
    script: String,
    /// The job's output file, and how far the driver has read it.
    output: PathBuf,
    offset: u64,
    /// The job's output as its node sends it (`JobOutput`), when that node does not see the file.
    relayed: mpsc::Receiver<Vec<u8>>,
    /// The experiment's directory, and whether the driver has said that jobs run where it is not.
    unshared: Arc<(PathBuf, AtomicBool)>,
    /// A line read in part.
    pending: String,
    watch: StepWatch,
    stopping: Escalation,
    log_paths: Vec<PathBuf>,
    job_log: PathBuf,
    rendezvous: PathBuf,
    registration: Registration,
    board: Arc<Board>,
    world: u32,
    /// The exit code the job's last line gave for its ranks' step.
    step_exit: Option<i32>,
    /// The job's output says Slurm started it again after a requeue.
    requeue_seen: bool,
    /// The job was submitted to start later (`--begin` among the user's
    /// options): waiting for its begin time says nothing of a requeue.
    begins_later: bool,
    /// The job has written something (to its file, or through the relay): it ran.
    heard: bool,
    /// Each rank's node, as its first line says (empty until then).
    rank_nodes: Vec<String>,
}

/// How a job left the driver's sight.
#[derive(Debug)]
enum Left {
    /// It ended in this state.
    Ended(JobState),
    /// Slurm put it back in its queue after it had run (and nestor cancelled it).
    Requeued(String),
    /// It is no longer listed (Slurm forgot it) without an end seen.
    Vanished,
}

impl JobRun {
    async fn run(mut self) -> ExitOutcome {
        let outcome = self.follow().await;
        let _ = std::fs::remove_file(&self.rendezvous);
        let aggregator = self.registration.aggregator();
        if outcome == ExitOutcome::Completed {
            for r in 0..self.world {
                aggregator.rank_finished(r);
            }
        } else {
            aggregator.fail();
        }
        outcome
    }

    /// Submits the job and follows it to its end; the run's outcome.
    async fn follow(&mut self) -> ExitOutcome {
        let id = match self.submit().await {
            Ok(id) => id,
            Err(outcome) => return outcome,
        };
        tracing::info!(trial = %self.trial_id, job = %id, "submitted");
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.job_log)
            .and_then(|mut f| std::io::Write::write_all(&mut f, format!("nestor: job {id} ({}) submitted\n", self.name).as_bytes()));
        let left = self.watch_job(&id).await;
        // What the job wrote last (a job's relay has sent everything before its job ends).
        while let Ok(bytes) = self.relayed.try_recv() {
            self.take_output(&bytes, false);
        }
        self.read_output(true);
        let requested = self.stopping.asked();
        let failed = |why: String| ExitOutcome::Failed(format!("job {id}: {why}"));
        let exit_code = self.step_exit;
        // Slurm started it again after a requeue before a reading showed it queued: the batch script ran
        // nothing and said so; the run ended when the job went back to the queue.
        let left = match left {
            Left::Ended(_) | Left::Vanished if self.requeue_seen => Left::Requeued("it was started again".into()),
            other => other,
        };
        match left {
            Left::Requeued(why) if requested == StopLevel::Run => {
                ExitOutcome::Infrastructure(format!("Slurm put job {id} back in its queue ({why}); the trial goes on from its latest checkpoint in a new job"))
            }
            Left::Requeued(_) => ExitOutcome::Stopped,
            Left::Ended(state) => match state.end() {
                Some(JobEnd::Done) | Some(JobEnd::Failed) => {
                    let code = match (state == JobState::Completed, exit_code) {
                        (true, _) => 0,
                        (false, Some(c)) if c != 0 => c,
                        (false, _) => 1,
                    };
                    self.step_outcome(code, requested, &id)
                }
                Some(JobEnd::OutOfMemory) if requested == StopLevel::Run => failed(format!(
                    "out of memory: Slurm ended the job for using more memory than it asked for ({}); ask for more with the workers' `memory`",
                    self.job_log.display()
                )),
                Some(JobEnd::Cancelled) if requested == StopLevel::Run => ExitOutcome::Infrastructure(format!(
                    "job {id} was cancelled outside nestor (scancel, an operator); the trial goes on from its latest checkpoint"
                )),
                Some(JobEnd::Infrastructure(why)) if requested == StopLevel::Run => {
                    ExitOutcome::Infrastructure(format!("{why} (job {id}); the trial goes on from its latest checkpoint"))
                }
                Some(_) => ExitOutcome::Stopped,
                None => failed(format!("ended in state {state:?}")),
            },
            Left::Vanished => match exit_code {
                Some(code) => self.step_outcome(code, requested, &id),
                None if requested > StopLevel::Run => ExitOutcome::Stopped,
                None => ExitOutcome::Infrastructure(format!(
                    "Slurm no longer lists job {id} and it left no word of how it ended; the trial goes on from its latest checkpoint"
                )),
            },
        }
    }

    /// The outcome of a job whose step exited with `code`, as a step inside an allocation's.
    fn step_outcome(&mut self, code: i32, requested: StopLevel, id: &str) -> ExitOutcome {
        use std::os::unix::process::ExitStatusExt;
        let status = Ok(std::process::ExitStatus::from_raw((code & 0xff) << 8));
        let rank_nodes = self.rank_nodes.clone();
        let failed = self.watch.failed.take();
        let end = StepEnd {
            status: &status,
            requested,
            lost: None,
            refused: self.watch.refused.take(),
            down_here: &[],
            failed,
            rank_nodes: &rank_nodes,
        };
        match step_outcome(end, &self.log_paths, &self.job_log, |log| log_tail(log, 20)) {
            ExitOutcome::Failed(why) => ExitOutcome::Failed(format!("job {id}: {why}")),
            ExitOutcome::Infrastructure(why) => ExitOutcome::Infrastructure(format!("job {id}: {why}")),
            other => other,
        }
    }
}

impl JobRun {
    /// `sbatch`: the job's id, or how the run ends when Slurm will not take it.
    async fn submit(&mut self) -> Result<String, ExitOutcome> {
        if self.stopping.asked() > StopLevel::Run {
            return Err(ExitOutcome::Stopped);
        }
        self.board.count_call();
        let mut child = self.sbatch.spawn().map_err(|e| ExitOutcome::Failed(format!("cannot run sbatch: {e}")))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(self.script.as_bytes()).await;
        }
        let out = child.wait_with_output().await.map_err(|e| ExitOutcome::Failed(format!("sbatch: {e}")))?;
        let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if !out.status.success() {
            let said = if said.is_empty() { format!("sbatch {}", crate::groups::describe_exit(out.status)) } else { said };
            if transient(&said) {
                tokio::time::sleep(SUBMIT_BACKOFF).await;
                return Err(ExitOutcome::Infrastructure(format!("Slurm did not take the trial's job now: {said}")));
            }
            return Err(ExitOutcome::Failed(format!("Slurm refused the trial's job: {said}")));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let id = text.trim().split(';').next().unwrap_or_default().trim().to_string();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit() || c == '_') {
            return Err(ExitOutcome::Failed(format!("sbatch gave no job id: {:?} {said}", text.trim())));
        }
        self.board.poke.notify_one();
        Ok(id)
    }

    /// Follows job `id` until it leaves: its states from the board, its
    /// output as it grows, stops as they are asked.
    async fn watch_job(&mut self, id: &str) -> Left {
        let mut readings = self.board.readings.subscribe();
        readings.mark_changed();
        let submitted = tokio::time::Instant::now();
        let mut seen: Option<JobState> = None;
        let mut ran = false;
        let mut warned = false;
        let mut tail = tokio::time::interval(Duration::from_millis(500));
        tail.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = readings.changed() => {
                    if changed.is_err() {
                        return Left::Vanished;
                    }
                    let reading = readings.borrow_and_update().clone();
                    if let Some(e) = &reading.error {
                        if !warned {
                            tracing::warn!(trial = %self.trial_id, job = %id, "reading the jobs' states: {e}; trying again");
                            warned = true;
                        }
                        continue;
                    }
                    warned = false;
                    match reading.jobs.get(id) {
                        Some(row) => {
                            match &row.state {
                                JobState::Running | JobState::Completing | JobState::Suspended => ran = true,
                                // Back in the queue after it ran. It may have run between two readings: its
                                // output, or Slurm's reason (a requeued job waits for a begin time two
                                // minutes on; nestor asks for none), says so.
                                JobState::Pending | JobState::Requeued | JobState::Held
                                    if ran
                                        || self.requeue_seen
                                        || self.heard
                                        || (row.reason == "BeginTime" && !self.begins_later) =>
                                {
                                    let why = if row.reason.is_empty() { format!("{:?}", row.state) } else { row.reason.clone() };
                                    self.cancel(id, None).await;
                                    return Left::Requeued(why);
                                }
                                state => {
                                    if state.end().is_some() {
                                        return Left::Ended(state.clone());
                                    }
                                }
                            }
                            seen = Some(row.state.clone());
                        }
                        None if seen.is_some() || self.step_exit.is_some() => return Left::Vanished,
                        None if submitted.elapsed() > LISTED_WITHIN => return Left::Vanished,
                        None => {}
                    }
                }
                _ = tail.tick() => self.read_output(false),
                Some(bytes) = self.relayed.recv() => self.take_output(&bytes, false),
                step = self.stopping.next() => match step {
                    StopStep::Terminate if ran => self.cancel(id, Some("TERM")).await,
                    // Not running yet, or past its grace period: the job goes.
                    _ => self.cancel(id, None).await,
                },
            }
        }
    }

    /// `scancel` (with `signal`: the signal to the job's steps' tasks; else the whole job).
    async fn cancel(&self, id: &str, signal: Option<&str>) {
        self.board.count_call();
        let mut c = tokio::process::Command::new("scancel");
        if let Some(s) = signal {
            c.arg(format!("--signal={s}"));
        }
        c.arg(id).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        match c.output().await {
            Ok(out) if !out.status.success() => {
                tracing::warn!(trial = %self.trial_id, job = %id, "scancel: {}", String::from_utf8_lossy(&out.stderr).trim());
            }
            Err(e) => tracing::warn!(trial = %self.trial_id, job = %id, "scancel: {e}"),
            Ok(_) => {}
        }
        self.board.poke.notify_one();
    }

    /// Reads what the job's output file gained since the last time; `all`:
    /// a last line without its newline too.
    fn read_output(&mut self, all: bool) {
        let Ok(mut f) = std::fs::File::open(&self.output) else { return };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut bytes = Vec::new();
        let Ok(n) = f.read_to_end(&mut bytes) else { return };
        self.offset += n as u64;
        self.take_output(&bytes, all);
    }

    /// Handles what the job wrote next: its whole lines; `all`: a last
    /// line without its newline too.
    fn take_output(&mut self, bytes: &[u8], all: bool) {
        self.heard |= !bytes.is_empty();
        self.pending.push_str(&String::from_utf8_lossy(bytes));
        while let Some(at) = self.pending.find('\n') {
            let line: String = self.pending.drain(..=at).collect();
            self.on_line(line.trim_end_matches(['\n', '\r']));
        }
        if all && !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.on_line(&line);
        }
    }

    fn on_line(&mut self, line: &str) {
        if let Some(code) = line.strip_prefix(STEP_EXIT) {
            self.step_exit = code.trim().parse().ok();
        }
        if line.contains("was put back in the queue; this run ends") {
            self.requeue_seen = true;
        }
        if let Some(node) = line.strip_prefix(UNSHARED).and_then(|rest| rest.split(':').next()) {
            let (exp_dir, noted) = &*self.unshared;
            if !noted.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "nestor: {} is not visible on {node} (trial {}): jobs' output comes to the driver, and their ranks ship checkpoints through it",
                    exp_dir.display(),
                    self.trial_id
                );
            }
        }
        // `  r: nestor: rank r of W on NODE (...)`: the prologue's first line says where rank r runs.
        if let Some((r, text)) = super::output::labelled(line) {
            if let Some(node) = text.strip_prefix(&format!("nestor: rank {r} of ")).and_then(|t| t.split(" on ").nth(1)) {
                if let (Some(slot), Some(name)) = (self.rank_nodes.get_mut(r as usize), node.split_whitespace().next()) {
                    *slot = name.to_string();
                }
            }
        }
        self.watch.on_line(line);
    }
}

/// Whether sbatch's refusal may pass (a busy controller, a limit of the queue).
fn transient(said: &str) -> bool {
    let s = said.to_ascii_lowercase();
    ["temporarily", "timed out", "unable to contact", "try again", "maxsubmit", "submit limit", "slurm_persist", "connection refused"]
        .iter()
        .any(|w| s.contains(w))
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

    #[test]
    fn a_refusal_that_may_pass_is_told_from_one_that_will_not() {
        assert!(transient("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"));
        assert!(transient("sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying"));
        assert!(transient("sbatch: error: QOSMaxSubmitJobPerUserLimit"));
        assert!(!transient("sbatch: error: Batch job submission failed: Invalid partition name specified"));
        assert!(!transient("sbatch: error: Batch job submission failed: Requested node configuration is not available"));
    }
}
