//! Trials as Slurm job steps: each run of a trial is one `srun` inside the
//! allocation, its ranks on the nodes the pool chose (`--distribution
//! arbitrary`, one host per rank), so Slurm launches, confines and kills
//! them together.
//!
//! Every rank gets what a local rank gets: a small shell prologue maps
//! `SLURM_PROCID` to the rank's row of per-rank tables (its local rank,
//! node rank, `CUDA_VISIBLE_DEVICES`, `OMP_NUM_THREADS`, checkpoint shard)
//! and `exec`s the worker. `srun --label` prefixes each line with its task,
//! which the driver splits into `logs/rank-<r>.log`; srun's own lines go to
//! `logs/srun.log`, and its `task N: Exited with exit code C` names the
//! rank that failed (the others then read `Terminated`). `--kill-on-bad-exit`
//! ends the step when one rank fails.
//!
//! Stopping: a graceful stop is `scancel --signal=TERM <job>.<step>` (the
//! ranks get SIGTERM where they run); a kill is SIGTERM to `srun`, which
//! then ends the step on every node. `srun` gets that same SIGTERM when the
//! driver dies (`PR_SET_PDEATHSIG`), so a killed driver leaves no step behind.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

use super::output::{step_outcome, StepEnd, StepWatch};
use super::SlurmAllocation;
use crate::backend::{Backend, Event, EventKind, ExitOutcome, LaunchError, LaunchSpec, StepProgress, StopLevel, TrialHandle};
use crate::groups::{dies_with_driver, signal_group};
use crate::process::{common_env, free_port, log_tail, ProcessConfig};
use crate::service::ReportServer;
use crate::supervise::{supervise, Escalation, Groups, StopStep};
use crate::token::random_token;

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

/// Run by each rank before the worker: its row of the per-rank tables.
const PROLOGUE: &str = r#"r=${SLURM_PROCID:?not a Slurm task}; f=$((r + 1))
pick() { printf '%s' "$1" | cut -d';' -f"$f"; }
RANK=$r; WORLD_SIZE=$SLURM_NTASKS
LOCAL_RANK=$(pick "$NESTOR_RANKS_LOCAL"); NODE_RANK=$(pick "$NESTOR_RANKS_NODE"); GROUP_RANK=$NODE_RANK
LOCAL_WORLD_SIZE=$(pick "$NESTOR_RANKS_LWS"); OMP_NUM_THREADS=$(pick "$NESTOR_RANKS_OMP")
if [ -z "$NESTOR_GPUS_FROM_SLURM" ]; then CUDA_VISIBLE_DEVICES=$(pick "$NESTOR_RANKS_CUDA"); fi
export RANK WORLD_SIZE LOCAL_RANK NODE_RANK GROUP_RANK LOCAL_WORLD_SIZE OMP_NUM_THREADS CUDA_VISIBLE_DEVICES
if [ -n "$NESTOR_SHIP_CHECKPOINTS" ]; then mkdir -p "$NESTOR_TRIAL_DIR"; fi
c=$(pick "$NESTOR_RANKS_CKPT")
if [ -n "$c" ]; then export NESTOR_CHECKPOINT="$c"; else unset NESTOR_CHECKPOINT; fi
unset NESTOR_RANKS_LOCAL NESTOR_RANKS_NODE NESTOR_RANKS_LWS NESTOR_RANKS_OMP NESTOR_RANKS_CUDA NESTOR_RANKS_CKPT NESTOR_GPUS_FROM_SLURM
g=; if [ -n "$CUDA_VISIBLE_DEVICES" ]; then g=", GPUs $CUDA_VISIBLE_DEVICES"; fi
echo "nestor: rank $r of $WORLD_SIZE on $SLURMD_NODENAME (node rank $NODE_RANK, local rank $LOCAL_RANK$g)" >&2
exec "$@""#;

/// Failures of runs blamed on one node before it is set aside.
pub const FAILURES_BEFORE_SET_ASIDE: u32 = 3;

/// Launches each trial run as a job step of the allocation nestor runs in.
#[derive(Debug, Clone)]
pub struct SlurmBackend {
    config: Arc<ProcessConfig>,
    server: Arc<ReportServer>,
    allocation: Arc<SlurmAllocation>,
    /// What workers are told to report to (`NESTOR_ADDR`).
    report_url: String,
    /// Nodes' health, as the steps' ends tell it.
    health: Arc<std::sync::Mutex<Health>>,
    /// The name of its node probes' job steps (`nestor-<experiment>-probe`
    /// once [`SlurmBackend::experiment`] names it): a leftover probe is
    /// cancelled with the experiment's other steps.
    probe_name: String,
    /// Some node does not see the experiment's directory: ranks ship their
    /// checkpoint shards through the report channel and fetch the one they
    /// resume from, the trial directory is a node-local one of the same
    /// path, and `nestor.torch` meets at the TCP store rank 0 opens on a
    /// free port of its node and posts to the driver (`Rendezvous`).
    shipping: bool,
}

/// What the steps' ends said of the nodes.
#[derive(Debug, Default)]
struct Health {
    /// Failed runs blamed on each node.
    failures: BTreeMap<String, u32>,
    /// Nodes set aside, with why.
    lost: BTreeMap<String, String>,
}

impl Health {
    /// Marks `node` down; the node and why, the first time.
    fn node_down(&mut self, node: &str, why: &str) -> Option<(String, String)> {
        if self.lost.contains_key(node) {
            return None;
        }
        self.lost.insert(node.to_string(), why.to_string());
        Some((node.to_string(), why.to_string()))
    }

    /// Counts a failed run against `node`; the node and why when that sets it aside.
    fn blame(&mut self, node: &str) -> Option<(String, String)> {
        let n = self.failures.entry(node.to_string()).or_insert(0);
        *n += 1;
        if *n >= FAILURES_BEFORE_SET_ASIDE {
            let why = format!("{n} runs failed on it");
            return self.node_down(node, &why);
        }
        None
    }
}

impl SlurmBackend {
    /// Starts the report server on `config.report_bind`; workers report to
    /// `advertise` (`host` or `host:port`; default: the address it is bound
    /// to). Must be called inside a tokio runtime.
    pub async fn start(config: ProcessConfig, allocation: SlurmAllocation, advertise: Option<&str>) -> std::io::Result<Self> {
        let server = ReportServer::start(config.report_bind).await?;
        server.serve_files(&config.files);
        let port = server.addr().port();
        let report_url = match advertise {
            Some(a) if a.contains(':') => format!("http://{a}"),
            Some(host) => format!("http://{host}:{port}"),
            None => server.url(),
        };
        Ok(Self {
            config: Arc::new(config),
            server: Arc::new(server),
            allocation: Arc::new(allocation),
            report_url,
            health: Arc::default(),
            probe_name: "nestor-probe".into(),
            shipping: false,
        })
    }

    /// Names the experiment in `exp_dir` (its node probes' steps are named after it).
    #[must_use]
    pub fn experiment(mut self, exp_dir: &std::path::Path) -> Self {
        self.probe_name = super::startup::probe_name(exp_dir);
        self
    }

    /// Whether ranks ship their checkpoints through the report channel (some
    /// node does not see the experiment's directory).
    #[must_use]
    pub fn shipping(mut self, shipping: bool) -> Self {
        self.shipping = shipping;
        self
    }

    /// The URL workers report to.
    pub fn report_url(&self) -> &str {
        &self.report_url
    }

    /// The allocation it launches into.
    pub fn allocation(&self) -> &SlurmAllocation {
        &self.allocation
    }
}

/// Where a step's GPUs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepGpus {
    /// The allocation has GPUs (GRES) and the ranks use none: the step asks
    /// for none (`--gres=none`), else it would hold every GPU of its nodes
    /// and the next step would wait for them.
    None,
    /// The ranks use this many whole GPUs each: Slurm picks free ones of
    /// the allocation's (`--gpus-per-task`), binds each rank to its own and
    /// sets `CUDA_VISIBLE_DEVICES`, confining them where the cluster does.
    /// The pool books the same counts per node, so a step never waits.
    Slurm(usize),
    /// The allocation names no GPUs (a cluster without GRES, or declared
    /// `[resources]`), or the ranks share GPUs: each rank gets the pool's
    /// indices in `CUDA_VISIBLE_DEVICES`, and the step asks Slurm for none.
    Pool,
}

fn step_gpus(allocation: &SlurmAllocation, bundles: &[crate::WorkerBundle]) -> StepGpus {
    let gres = bundles.iter().any(|b| allocation.node(&b.node).is_some_and(|n| !n.gpus.is_empty()));
    let per_task = bundles.iter().map(|b| b.gpus.len()).max().unwrap_or(0);
    let shared = bundles.iter().any(|b| !b.gpus.is_empty() && b.gpu_share > 0.0 && b.gpu_share < 1.0);
    match (gres, per_task, shared) {
        (false, ..) | (true, _, true) => StepGpus::Pool,
        (true, 0, false) => StepGpus::None,
        (true, n, false) => StepGpus::Slurm(n),
    }
}

/// `nestor-<experiment>-`: the names of the job steps of the experiment in `exp_dir` begin so.
pub(super) fn step_prefix(exp_dir: &std::path::Path) -> String {
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

/// How long a node has to run a trivial job step before it counts as gone.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A pause before a run the cluster refused to start ends, when no node of
/// it is down: the cluster is settling (releasing a lost step's CPUs).
const REFUSAL_BACKOFF: Duration = Duration::from_secs(2);

/// Whether `node` of `job` still runs a job step (`true` on it): a healthy
/// node answers in well under a second, busy or not (the probe overlaps the
/// steps that hold its CPUs).
async fn answers(job: &str, node: &str, name: &str) -> bool {
    let probe = tokio::process::Command::from(srun(job))
        .arg(format!("--job-name={name}"))
        .args(["--overlap", "--nodes=1", "--ntasks=1", "--mem-per-cpu=1", "--quiet"])
        .arg(format!("--nodelist={node}"))
        .arg("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status();
    matches!(tokio::time::timeout(PROBE_TIMEOUT, probe).await, Ok(Ok(s)) if s.success())
}

impl Backend for SlurmBackend {
    fn launch(&self, spec: LaunchSpec, events: mpsc::UnboundedSender<Event>) -> Result<TrialHandle, LaunchError> {
        let cfg = &self.config;
        let logs = spec.trial_dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|source| LaunchError::Io { path: logs.clone(), source })?;
        let world = spec.world_size();
        let bundles: Vec<_> = (0..world).map(|r| spec.bundle(r)).collect();
        // Each rank's node, in rank order; a node's number is its place among the nodes the run uses.
        let mut order: Vec<&str> = Vec::new();
        for (rank, b) in bundles.iter().enumerate() {
            if self.allocation.node(&b.node).is_none() {
                return Err(LaunchError::Refused(format!(
                    "rank {rank} has no node of Slurm job {} (got {:?})",
                    self.allocation.job_id, b.node
                )));
            }
            if !order.contains(&b.node.as_str()) {
                order.push(&b.node);
            }
        }
        let node_rank = |b: &crate::WorkerBundle| order.iter().position(|n| *n == b.node).unwrap_or(0);
        let mut local = Vec::with_capacity(bundles.len());
        for (r, b) in bundles.iter().enumerate() {
            local.push(bundles[..r].iter().filter(|x| x.node == b.node).count());
        }
        let lws: Vec<usize> = bundles.iter().map(|b| bundles.iter().filter(|x| x.node == b.node).count()).collect();
        let table = |f: &dyn Fn(usize) -> String| (0..bundles.len()).map(f).collect::<Vec<_>>().join(";");
        let token = random_token();
        let master = self.allocation.node(order[0]).map_or_else(|| order[0].to_string(), |n| n.addr.clone());
        let master_port = free_port();
        let rendezvous = logs.join(format!(".rendezvous-{}", &token[..16]));
        // <experiment>/trials/<id>: the experiment's directory is two up.
        let exp_dir = spec.trial_dir.parent().and_then(std::path::Path::parent).unwrap_or(&spec.trial_dir);
        let step_name = format!("{}{}-{}", step_prefix(exp_dir), spec.trial_id, &token[..8]);
        // What the step holds, should it outlive this driver stuck on a lost node (read by a resume).
        let record = super::startup::record_path(&spec.trial_dir, &token[..8]);
        super::startup::write_record(&spec.trial_dir, &token[..8], &bundles);
        let cpus_per_task = bundles.iter().map(|b| b.cpus.ceil().max(1.0) as u64).max().unwrap_or(1);
        // Memory per CPU: what a rank asked for, else its node's share per CPU (so steps run side by side).
        let mem_per_cpu_mb = match bundles.iter().map(|b| b.memory_bytes).fold(0.0, f64::max) {
            m if m > 0.0 => Some((m / cpus_per_task as f64 / 1048576.0).floor().max(1.0) as u64),
            _ => self
                .allocation
                .node(order[0])
                .and_then(|n| n.memory_bytes.map(|m| (m / f64::from(n.cpus.max(1)) / 1048576.0).floor().max(1.0) as u64)),
        };
        let mut cmd = tokio::process::Command::from(srun(&self.allocation.job_id));
        cmd.arg(format!("--job-name={step_name}"))
            .args(["--exact", "--kill-on-bad-exit=1", "--label", "--distribution=arbitrary", "--export=ALL"])
            .arg(format!("--nodelist={}", bundles.iter().map(|b| b.node.as_str()).collect::<Vec<_>>().join(",")))
            .arg(format!("--ntasks={world}"))
            .arg(format!("--nodes={}", order.len()))
            .arg(format!("--cpus-per-task={cpus_per_task}"));
        if let Some(m) = mem_per_cpu_mb {
            cmd.arg(format!("--mem-per-cpu={m}"));
        }
        match step_gpus(&self.allocation, &bundles) {
            StepGpus::Slurm(n) => {
                cmd.arg(format!("--gpus-per-task={n}")).env("NESTOR_GPUS_FROM_SLURM", "1");
            }
            StepGpus::None => {
                cmd.arg("--gres=none");
            }
            StepGpus::Pool => {}
        }
        cmd.args(["/bin/sh", "-c", PROLOGUE, "nestor-rank"]).args(&cfg.command);
        cmd.envs(&cfg.env)
            .envs(common_env(cfg, &spec, &self.report_url, &token, &master, master_port, &rendezvous))
            .env("NESTOR_RANKS_LOCAL", table(&|r| local[r].to_string()))
            .env("NESTOR_RANKS_NODE", table(&|r| node_rank(&bundles[r]).to_string()))
            .env("NESTOR_RANKS_LWS", table(&|r| lws[r].to_string()))
            .env("NESTOR_RANKS_OMP", table(&|r| bundles[r].omp_threads().to_string()))
            .env("NESTOR_RANKS_CUDA", table(&|r| bundles[r].cuda_visible_devices()))
            .env(
                "NESTOR_RANKS_CKPT",
                table(&|r| match &spec.checkpoint {
                    Some(c) if !self.shipping => crate::checkpoint::shard_for(c, r as u32).display().to_string(),
                    _ => String::new(),
                }),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(false);
        if self.shipping {
            // No file the nodes share: no rendezvous file either; ranks meet through the driver.
            cmd.env_remove("NESTOR_RENDEZVOUS_FILE").env("NESTOR_SHIP_CHECKPOINTS", "1").env("NESTOR_RENDEZVOUS", "driver");
            if spec.checkpoint.is_some() {
                cmd.env("NESTOR_CHECKPOINT_FETCH", "1");
            }
        }
        if let Some(dir) = &cfg.working_dir {
            cmd.current_dir(dir);
        }
        // srun ends its step on SIGTERM: the driver's death takes the step with it.
        dies_with_driver(&mut cmd, libc::SIGTERM);
        let log_paths: Vec<PathBuf> = (0..world).map(|r| logs.join(format!("rank-{r}.log"))).collect();
        let srun_log = logs.join("srun.log");
        let open = |p: &PathBuf| {
            std::fs::OpenOptions::new().create(true).append(true).open(p).map_err(|source| LaunchError::Io { path: p.clone(), source })
        };
        let rank_files = log_paths.iter().map(open).collect::<Result<Vec<_>, _>>()?;
        let srun_file = open(&srun_log)?;
        let roots = spec.roots(cfg.working_dir.as_deref());
        let registration = self.server.register(&spec, token, roots, events.clone());
        let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn { program: "srun".into(), source })?;
        let pgid = child.id().map_or(0, |p| p as i32);
        // Lines to the rank logs; srun's own to srun.log, watching for the task that failed.
        let (lines_tx, mut lines) = mpsc::unbounded_channel::<String>();
        for stream in [
            child.stdout.take().map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
            child.stderr.take().map(|s| Box::new(s) as _),
        ]
        .into_iter()
        .flatten()
        {
            let tx = lines_tx.clone();
            tokio::spawn(async move {
                let mut reader = tokio::io::BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        drop(lines_tx);
        let (handle, stop) = TrialHandle::new(
            vec![pgid].into_iter().filter(|&g| g > 0).collect(),
            Some(Arc::clone(registration.aggregator()) as Arc<dyn StepProgress>),
        );
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handle = handle.killing_with(libc::SIGTERM).started_by(Arc::clone(&started));
        let grace = cfg.grace_period;
        let probe_name = self.probe_name.clone();
        let trial_id = spec.trial_id;
        let job = self.allocation.job_id.clone();
        let health = Arc::clone(&self.health);
        let rank_nodes: Vec<String> = bundles.iter().map(|b| b.node.clone()).collect();
        let node_events = events.clone();
        let node_trial = trial_id.clone();
        let groups: Groups = Arc::new(std::sync::Mutex::new(vec![pgid]));
        supervise(trial_id.clone(), events, groups, libc::SIGTERM, async move {
            let mut stopping = Escalation::new(stop, grace);
            let mut watch = StepWatch::new(rank_files, srun_file, started);
            let mut lines_open = true;
            let status = loop {
                tokio::select! {
                    line = lines.recv(), if lines_open => match line {
                        Some(line) => watch.on_line(&line),
                        None => lines_open = false,
                    },
                    status = child.wait(), if !lines_open => break status,
                    step = stopping.next() => match step {
                        StopStep::Kill => {
                            if stopping.requested < StopLevel::Kill {
                                tracing::warn!(trial = %trial_id, "the job step still runs after SIGTERM; ending it");
                            }
                            signal_group(pgid, libc::SIGTERM);
                        }
                        StopStep::Terminate => {
                            // The ranks get SIGTERM where they run; srun ends when they do. Off the
                            // loop: squeue and scancel wait on the controller, and the step's lines
                            // (and its end) must keep flowing meanwhile.
                            let (job, step_name) = (job.clone(), step_name.clone());
                            tokio::spawn(async move {
                                match steps(&job).await.into_iter().find(|s| s.name == step_name).map(|s| s.id) {
                                    Some(id) => {
                                        let _ = tokio::process::Command::new("scancel").args(["--signal=TERM", &id]).status().await;
                                    }
                                    None => signal_group(pgid, libc::SIGTERM),
                                }
                            });
                        }
                    },
                }
            };
            let StepWatch { lost, refused, failed, .. } = watch;
            let requested = stopping.asked();
            let _ = std::fs::remove_file(&rendezvous);
            let aggregator = registration.aggregator();
            // Which nodes to ask whether they are still there: the failed rank's, or after a
            // kill (a hang), those of the ranks the step waited for (all, if none had reported).
            let failed_here = matches!(&status, Ok(s) if !s.success()) && requested == StopLevel::Run;
            let suspects: Vec<String> = match (&failed, requested) {
                _ if lost.is_some() => Vec::new(),
                (Some((_, node, _)), StopLevel::Run) if failed_here => vec![node.clone()],
                (_, StopLevel::Kill) => {
                    let lagging = aggregator.lagging_ranks();
                    let mut nodes: Vec<String> = if lagging.is_empty() {
                        rank_nodes.clone()
                    } else {
                        lagging.iter().filter_map(|&r| rank_nodes.get(r as usize).cloned()).collect()
                    };
                    nodes.dedup();
                    nodes
                }
                _ => Vec::new(),
            };
            let mut gone = Vec::new();
            for node in suspects {
                if !answers(&job, &node, &probe_name).await {
                    gone.push(node);
                }
            }
            // A step the cluster would not create: the nodes Slurm itself calls down go aside.
            let mut down_here = Vec::new();
            if refused.is_some() && lost.is_none() {
                let mut nodes = rank_nodes.clone();
                nodes.sort();
                nodes.dedup();
                down_here = super::startup::down(&nodes).await;
                if down_here.is_empty() {
                    // None is down: the cluster is busy or settling. A pause before the run's end,
                    // so its restart does not spend its retries at once.
                    tokio::time::sleep(REFUSAL_BACKOFF).await;
                }
            }
            let newly_lost = {
                let mut h = health.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let mut newly = Vec::new();
                if let Some((node, why)) = &lost {
                    newly.extend(h.node_down(node, why));
                }
                for node in &gone {
                    newly.extend(h.node_down(node, &format!("it did not run a job step within {} s", PROBE_TIMEOUT.as_secs())));
                }
                for (node, state) in &down_here {
                    newly.extend(h.node_down(node, &format!("Slurm says it is {state}")));
                }
                if let (Some((_, node, _)), true, true) = (&failed, failed_here, gone.is_empty()) {
                    newly.extend(h.blame(node));
                }
                newly
            };
            // Set aside before the run's exit comes: its restart goes elsewhere.
            for (node, why) in newly_lost {
                let _ = node_events.send(Event { trial_id: node_trial.clone(), kind: EventKind::NodeLost { node, why } });
            }
            let lost = lost.or_else(|| gone.first().map(|n| (n.clone(), "it stopped answering".to_string())));
            if lost.is_none() {
                // The step ended on every node: nothing of it can be left stuck.
                let _ = std::fs::remove_file(&record);
            }
            let end = StepEnd { status: &status, requested, lost, refused, down_here: &down_here, failed, rank_nodes: &rank_nodes };
            let outcome = step_outcome(end, &log_paths, &srun_log, |log| log_tail(log, 20));
            if outcome == ExitOutcome::Completed {
                for r in 0..world {
                    aggregator.rank_finished(r);
                }
            } else {
                aggregator.fail();
            }
            // Its reports are refused from here on.
            drop(registration);
            outcome
        });
        Ok(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::SlurmNode;

    #[test]
    fn a_node_is_set_aside_after_repeated_failures_and_reported_once() {
        let mut h = Health::default();
        for _ in 1..FAILURES_BEFORE_SET_ASIDE {
            assert_eq!(h.blame("node1"), None);
        }
        assert!(h.lost.is_empty());
        assert_eq!(h.blame("node1"), Some(("node1".into(), "3 runs failed on it".into())));
        assert_eq!(h.lost["node1"], "3 runs failed on it");
        // Once set aside, a node is not reported again.
        assert_eq!(h.blame("node1"), None);
        assert_eq!(h.node_down("node1", "gone"), None);
    }

    #[test]
    fn a_step_asks_slurm_for_whole_gpus_only_where_the_allocation_has_them() {
        let node = |name: &str, gpus: Vec<u32>| SlurmNode { name: name.into(), cpus: 4, memory_bytes: None, gpus, addr: name.into() };
        let with = SlurmAllocation { job_id: "7".into(), nodes: vec![node("a", vec![0, 1]), node("b", vec![0, 1])] };
        let without = SlurmAllocation { job_id: "7".into(), nodes: vec![node("a", vec![]), node("b", vec![])] };
        let bundle = |n: &str, gpus: Vec<u32>, share: f64| crate::WorkerBundle {
            node: n.into(),
            gpus,
            gpu_share: share,
            ..crate::WorkerBundle::cpus(1.0)
        };
        let cpu = [bundle("a", vec![], 0.0), bundle("b", vec![], 0.0)];
        let whole = [bundle("a", vec![0, 1], 1.0), bundle("b", vec![1, 0], 1.0)];
        let half = [bundle("a", vec![1], 0.5)];
        assert_eq!(step_gpus(&with, &cpu), StepGpus::None);
        assert_eq!(step_gpus(&with, &whole), StepGpus::Slurm(2));
        assert_eq!(step_gpus(&with, &half), StepGpus::Pool);
        assert_eq!(step_gpus(&without, &cpu), StepGpus::Pool);
        assert_eq!(step_gpus(&without, &whole), StepGpus::Pool);
    }
}
