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

use std::process::Stdio;
use std::sync::Arc;

use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

use super::commands::{cpus_per_task, srun, step_prefix};
use super::output::StepWatch;
use super::supervisor::{Health, StepMonitor};
use super::SlurmAllocation;
use crate::backend::{Backend, Event, LaunchError, LaunchSpec, StepProgress, TrialHandle};
use crate::command::ProcessConfig;
use crate::contract::{NodeView, RunPlan};
use crate::groups::dies_with_driver;
use crate::process::{common_env, free_port, plan_settings, ReportTo};
use crate::service::ReportServer;
use crate::supervise::{supervise, Escalation, Groups};
use crate::token::random_token;

/// Run by each rank before the worker: its row of the per-rank tables.
const PROLOGUE: &str = r#"r=${SLURM_PROCID:?not a Slurm task}; f=$((r + 1))
pick() { printf '%s' "$1" | cut -d';' -f"$f"; }
RANK=$r; WORLD_SIZE=$SLURM_NTASKS
LOCAL_RANK=$(pick "$NESTOR_RANKS_LOCAL"); NODE_RANK=$(pick "$NESTOR_RANKS_NODE"); GROUP_RANK=$NODE_RANK
LOCAL_WORLD_SIZE=$(pick "$NESTOR_RANKS_LWS"); OMP_NUM_THREADS=$(pick "$NESTOR_RANKS_OMP")
if [ -z "$NESTOR_GPUS_FROM_SLURM" ]; then CUDA_VISIBLE_DEVICES=$(pick "$NESTOR_RANKS_CUDA"); fi
export RANK WORLD_SIZE LOCAL_RANK NODE_RANK GROUP_RANK LOCAL_WORLD_SIZE OMP_NUM_THREADS CUDA_VISIBLE_DEVICES
if [ -n "$NESTOR_GPU_SAMPLER" ] && [ "$LOCAL_RANK" = 0 ]; then
  if [ -n "$NESTOR_GPUS_FROM_SLURM" ]; then gs=${SLURM_STEP_GPUS:-$CUDA_VISIBLE_DEVICES}; else gs=$(printf '%s' "$NESTOR_NODES_GPUS" | cut -d';' -f"$((NODE_RANK + 1))"); fi
  if [ -n "$gs" ]; then "$NESTOR_GPU_SAMPLER" gpu-sample --gpus "$gs" ${NESTOR_GPU_SHARED:+--shared} </dev/null >/dev/null 2>&1 & fi
fi
unset NESTOR_RANKS_LOCAL NESTOR_RANKS_NODE NESTOR_RANKS_LWS NESTOR_RANKS_OMP NESTOR_RANKS_CUDA NESTOR_GPUS_FROM_SLURM
unset NESTOR_GPU_SAMPLER NESTOR_NODES_GPUS NESTOR_GPU_SHARED
g=; if [ -n "$CUDA_VISIBLE_DEVICES" ]; then g=", GPUs $CUDA_VISIBLE_DEVICES"; fi
echo "nestor: rank $r of $WORLD_SIZE on $SLURMD_NODENAME (node rank $NODE_RANK, local rank $LOCAL_RANK$g)" >&2
exec "$@""#;

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
    start_timeout: std::time::Duration,
}

/// How long srun may wait for a step's resources, unless `[cluster] step_start_timeout_s` says.
pub const DEFAULT_STEP_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl SlurmBackend {
    /// Starts the report server on `config.report_bind`; workers report to
    /// `advertise` (`host` or `host:port`; default: the address it is bound
    /// to). Must be called inside a tokio runtime.
    pub async fn start(config: ProcessConfig, allocation: SlurmAllocation, advertise: Option<&str>) -> std::io::Result<Self> {
        let server = ReportServer::start_encrypted(config.report_bind).await?;
        server.serve_files(&config.files);
        let port = server.addr().port();
        let scheme = server.scheme();
        let report_url = match advertise {
            Some(a) if a.contains(':') => format!("{scheme}://{a}"),
            Some(host) => format!("{scheme}://{host}:{port}"),
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
            start_timeout: DEFAULT_STEP_START_TIMEOUT,
        })
    }

    /// How long srun may wait for a step's resources (busy nodes) before
    /// the run counts as one the cluster would not start.
    #[must_use]
    pub fn step_start_timeout(mut self, limit: std::time::Duration) -> Self {
        self.start_timeout = limit;
        self
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

/// Where a trial's ranks go in its step: one row per rank (its node's
/// place among the step's nodes, its local rank, its node's rank count) and
/// what each task asks Slurm for.
#[derive(Debug, Clone, PartialEq)]
struct Layout {
    /// The step's nodes, in the order their first rank comes.
    nodes: Vec<String>,
    /// Each rank's node's place in `nodes`.
    node_rank: Vec<usize>,
    /// Each rank's place among its node's ranks.
    local: Vec<usize>,
    /// Each rank's node's rank count.
    local_world: Vec<usize>,
    /// Whole CPUs per task (Slurm's unit): the largest rank's.
    cpus_per_task: u64,
    /// MB per CPU: what a rank asked for, else its first node's share per
    /// CPU (so steps run side by side); `None` where Slurm gives no limit.
    mem_per_cpu_mb: Option<u64>,
    gpus: StepGpus,
}

impl Layout {
    /// The layout of `bundles` (one per rank) in `allocation`; refused when
    /// a rank's node is not the allocation's.
    fn new(allocation: &SlurmAllocation, bundles: &[crate::WorkerBundle]) -> Result<Self, LaunchError> {
        let mut nodes: Vec<String> = Vec::new();
        for (rank, b) in bundles.iter().enumerate() {
            if allocation.node(&b.node).is_none() {
                return Err(LaunchError::Refused(format!("rank {rank} has no node of Slurm job {} (got {:?})", allocation.job_id, b.node)));
            }
            if !nodes.contains(&b.node) {
                nodes.push(b.node.clone());
            }
        }
        let node_rank = bundles.iter().map(|b| nodes.iter().position(|n| *n == b.node).unwrap_or(0)).collect();
        let local = (0..bundles.len()).map(|r| bundles[..r].iter().filter(|x| x.node == bundles[r].node).count()).collect();
        let local_world = bundles.iter().map(|b| bundles.iter().filter(|x| x.node == b.node).count()).collect();
        let cpus_per_task = u64::from(cpus_per_task(bundles));
        let mem_per_cpu_mb = match bundles.iter().map(|b| b.memory_bytes).fold(0.0, f64::max) {
            m if m > 0.0 => Some((m / cpus_per_task as f64 / 1048576.0).floor().max(1.0) as u64),
            _ => nodes
                .first()
                .and_then(|n| allocation.node(n))
                .and_then(|n| n.memory_bytes.map(|m| (m / f64::from(n.cpus.max(1)) / 1048576.0).floor().max(1.0) as u64)),
        };
        let gpus = step_gpus(allocation, bundles);
        Ok(Self { nodes, node_rank, local, local_world, cpus_per_task, mem_per_cpu_mb, gpus })
    }

    /// srun's options for the step named `name` (ranks placed one host
    /// each, in rank order: `--distribution=arbitrary`).
    fn srun_args(&self, name: &str, bundles: &[crate::WorkerBundle]) -> Vec<String> {
        let mut args = vec![format!("--job-name={name}")];
        args.extend(["--exact", "--kill-on-bad-exit=1", "--label", "--distribution=arbitrary", "--export=ALL"].map(String::from));
        args.push(format!("--nodelist={}", bundles.iter().map(|b| b.node.as_str()).collect::<Vec<_>>().join(",")));
        args.push(format!("--ntasks={}", bundles.len()));
        args.push(format!("--nodes={}", self.nodes.len()));
        args.push(format!("--cpus-per-task={}", self.cpus_per_task));
        if let Some(m) = self.mem_per_cpu_mb {
            args.push(format!("--mem-per-cpu={m}"));
        }
        match self.gpus {
            StepGpus::Slurm(n) => args.push(format!("--gpus-per-task={n}")),
            StepGpus::None => args.push("--gres=none".into()),
            StepGpus::Pool => {}
        }
        args
    }

    /// The per-rank tables the prologue reads (`;`-separated, in rank
    /// order): each rank's place and devices by torchrun's names.
    fn rank_tables(&self, bundles: &[crate::WorkerBundle]) -> Vec<(&'static str, String)> {
        let table = |f: &dyn Fn(usize) -> String| (0..bundles.len()).map(f).collect::<Vec<_>>().join(";");
        let mut env = vec![
            ("NESTOR_RANKS_LOCAL", table(&|r| self.local[r].to_string())),
            ("NESTOR_RANKS_NODE", table(&|r| self.node_rank[r].to_string())),
            ("NESTOR_RANKS_LWS", table(&|r| self.local_world[r].to_string())),
            ("NESTOR_RANKS_OMP", table(&|r| bundles[r].omp_threads().to_string())),
            ("NESTOR_RANKS_CUDA", table(&|r| bundles[r].cuda_visible_devices())),
        ];
        if matches!(self.gpus, StepGpus::Slurm(_)) {
            env.push(("NESTOR_GPUS_FROM_SLURM", "1".into()));
        }
        env
    }
}

impl Layout {
    /// What the prologue needs to start a GPU sampler beside each node's
    /// first rank (`nestor gpu-sample`, the binary at `binary`): nothing
    /// when the run holds no GPU or the sampler's binary is not known.
    fn sampler_env(&self, bundles: &[crate::WorkerBundle], binary: Option<String>) -> Vec<(&'static str, String)> {
        let Some(binary) = binary.filter(|_| bundles.iter().any(|b| !b.gpus.is_empty())) else { return Vec::new() };
        let per_node: Vec<String> = (0..self.nodes.len())
            .map(|n| {
                let gpus: std::collections::BTreeSet<u32> =
                    (0..bundles.len()).filter(|&r| self.node_rank[r] == n).flat_map(|r| bundles[r].gpus.iter().copied()).collect();
                gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            })
            .collect();
        let mut env = vec![("NESTOR_GPU_SAMPLER", binary), ("NESTOR_NODES_GPUS", per_node.join(";"))];
        if bundles.iter().any(|b| !b.gpus.is_empty() && b.gpu_share > 0.0 && b.gpu_share < 1.0) {
            env.push(("NESTOR_GPU_SHARED", "1".into()));
        }
        env
    }
}

/// Reads `stream` line by line into `tx` until it ends.
fn forward_lines(stream: impl tokio::io::AsyncRead + Send + Unpin + 'static, tx: mpsc::UnboundedSender<String>) {
    tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::new(stream).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
}

impl Backend for SlurmBackend {
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
        let layout = Layout::new(&self.allocation, &bundles)?;
        let token = random_token();
        let key = crate::token::run_key();
        let master = self.allocation.node(&layout.nodes[0]).map_or_else(|| layout.nodes[0].clone(), |n| n.addr.clone());
        let master_port = free_port();
        let rendezvous = logs.join(format!(".rendezvous-{key}"));
        // <experiment>/trials/<id>: the experiment's directory is two up.
        let exp_dir = spec.trial_dir.parent().and_then(std::path::Path::parent).unwrap_or(&spec.trial_dir);
        let step_name = format!("{}{}-{}", step_prefix(exp_dir), spec.trial_id, &key);
        // What the step holds, should it outlive this driver stuck on a lost node (read by a resume).
        let record = super::startup::record_path(&spec.trial_dir, &key);
        super::startup::write_record(&spec.trial_dir, &key, &bundles);
        let view = if self.shipping { NodeView::Unshared } else { NodeView::Shared };
        // No file the nodes share: no rendezvous file either; ranks meet through the driver.
        let rendezvous_file = (!self.shipping).then_some(rendezvous.as_path());
        let plan =
            RunPlan::new(plan_settings(cfg, &spec, ReportTo { url: &self.report_url, ca: self.server.ca_pem() }, rendezvous_file), &view);
        let mut cmd = tokio::process::Command::from(srun(&self.allocation.job_id));
        cmd.args(layout.srun_args(&step_name, &bundles)).args(["/bin/sh", "-c", PROLOGUE, "nestor-rank"]).args(&cfg.command);
        cmd.envs(&cfg.env)
            .envs(common_env(cfg, &plan, &token, &master, master_port))
            .envs(layout.rank_tables(&bundles))
            .envs(layout.sampler_env(&bundles, crate::process::nestor_binary()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(false);
        if let Some(dir) = &cfg.working_dir {
            cmd.current_dir(dir);
        }
        // srun ends its step on SIGTERM: the driver's death takes the step with it.
        dies_with_driver(&mut cmd, libc::SIGTERM);
        let (log_paths, rank_files, srun_log, srun_file) = super::output::open_logs(&logs, world, "srun.log")?;
        let roots = spec.roots(cfg.working_dir.as_deref());
        let registration = self.server.register(&spec, token, roots, events.clone());
        let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn { program: "srun".into(), source })?;
        let pgid = child.id().map_or(0, |p| p as i32);
        // Lines to the rank logs; srun's own to srun.log, watching for the task that failed.
        let (lines_tx, lines) = mpsc::unbounded_channel::<String>();
        if let Some(out) = child.stdout.take() {
            forward_lines(out, lines_tx.clone());
        }
        if let Some(err) = child.stderr.take() {
            forward_lines(err, lines_tx);
        }
        let (handle, stop) = TrialHandle::new(
            vec![pgid].into_iter().filter(|&g| g > 0).collect(),
            Some(Arc::clone(registration.aggregator()) as Arc<dyn StepProgress>),
        );
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handle = handle.killing_with(libc::SIGTERM).started_by(Arc::clone(&started));
        let monitor = StepMonitor {
            trial_id: spec.trial_id.clone(),
            job: self.allocation.job_id.clone(),
            step_name,
            child,
            pgid,
            lines,
            watch: StepWatch::new(rank_files, srun_file, started),
            stopping: Escalation::new(stop, cfg.grace_period),
            rank_nodes: bundles.iter().map(|b| b.node.clone()).collect(),
            log_paths,
            srun_log,
            record,
            rendezvous,
            registration,
            events: events.clone(),
            health: Arc::clone(&self.health),
            probe_name: self.probe_name.clone(),
            start_timeout: self.start_timeout,
        };
        let groups: Groups = Arc::new(std::sync::Mutex::new(vec![pgid]));
        supervise(spec.trial_id, events, groups, libc::SIGTERM, monitor.run());
        Ok(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::SlurmNode;

    #[test]
    fn a_steps_layout_gives_each_rank_its_row_and_slurm_the_tasks_shape() {
        let node =
            |name: &str| SlurmNode { name: name.into(), cpus: 4, memory_bytes: Some(4096.0 * 1048576.0), gpus: vec![], addr: name.into() };
        let allocation = SlurmAllocation { job_id: "7".into(), nodes: vec![node("a"), node("b")] };
        let on = |n: &str, cpus: f64| crate::WorkerBundle { node: n.into(), ..crate::WorkerBundle::cpus(cpus) };
        let ranks = [on("b", 1.0), on("a", 1.5), on("b", 1.0)];
        let layout = Layout::new(&allocation, &ranks).unwrap();
        assert_eq!(layout.nodes, ["b", "a"], "nodes in the order their first rank comes");
        assert_eq!(
            (layout.node_rank.clone(), layout.local.clone(), layout.local_world.clone()),
            (vec![0, 1, 0], vec![0, 0, 1], vec![2, 1, 2])
        );
        // Whole CPUs per task, the largest rank's; memory: the first node's share per CPU.
        assert_eq!((layout.cpus_per_task, layout.mem_per_cpu_mb), (2, Some(1024)));
        let args = layout.srun_args("nestor-e-t0-01234567", &ranks);
        for want in
            ["--job-name=nestor-e-t0-01234567", "--nodelist=b,a,b", "--ntasks=3", "--nodes=2", "--cpus-per-task=2", "--mem-per-cpu=1024"]
        {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        let tables: std::collections::BTreeMap<_, _> = layout.rank_tables(&ranks).into_iter().collect();
        assert_eq!(tables["NESTOR_RANKS_LOCAL"], "0;0;1");
        assert_eq!(tables["NESTOR_RANKS_NODE"], "0;1;0");
        assert_eq!(tables["NESTOR_RANKS_LWS"], "2;1;2");
        assert_eq!(tables["NESTOR_RANKS_OMP"], "1;1;1");
        assert!(!tables.contains_key("NESTOR_GPUS_FROM_SLURM"));
        // A rank on a node the job does not hold is refused, naming it.
        let err = Layout::new(&allocation, &[on("c", 1.0)]).unwrap_err();
        assert!(err.to_string().contains("rank 0 has no node of Slurm job 7"), "{err}");
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
