//! External-process trainables: a command per trial, in its own process
//! group, reporting over gRPC; SIGTERM then SIGKILL to stop it.

use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::backend::{Backend, Event, ExitOutcome, LaunchError, LaunchSpec, StepProgress, StopLevel, TrialHandle};
use crate::command::{ProcessConfig, PythonCommand, Warm};
use crate::contract::{ChannelPlan, NodeView, PlanSettings, RunPlan, TrialPlan, WorldPlan};
use crate::groups::{describe_exit_since, dies_with_driver, signal_group, wait_groups_gone, OomKills};
use crate::service::ReportServer;
use crate::supervise::{supervise, Escalation, Groups, StopStep};
use crate::token::random_token;
use crate::warm::{RankSpec, WarmPool};

/// Launches each trial as a group of worker processes, one per rank.
#[derive(Debug, Clone)]
pub struct ProcessBackend {
    config: Arc<ProcessConfig>,
    server: Arc<ReportServer>,
    warm: Arc<WarmPool>,
}

impl ProcessBackend {
    /// Starts the report server (on loopback unless configured otherwise).
    /// Must be called inside a tokio runtime.
    pub async fn start(config: ProcessConfig) -> std::io::Result<Self> {
        // Before any child starts: the front end's warm process, when it offered one.
        crate::warm::adopt_offered_warm_process();
        // A channel that can leave the machine is encrypted whatever the config says.
        let server = if config.encrypt || !config.report_bind.ip().is_loopback() {
            ReportServer::start_encrypted(config.report_bind).await?
        } else {
            ReportServer::start(config.report_bind).await?
        };
        server.serve_files(&config.files);
        Ok(Self { config: Arc::new(config), server: Arc::new(server), warm: Arc::new(WarmPool::default()) })
    }

    /// The report server's address.
    pub fn server_addr(&self) -> SocketAddr {
        self.server.addr()
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(29500)
}

/// The last `n` lines of a log file (empty when it cannot be read).
pub fn log_tail(path: &Path, n: usize) -> String {
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(8192)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The warm process's command (the workers' command, their environment
/// and working directory), dying with the driver; the pool adds the rest.
fn warm_command(cfg: &ProcessConfig) -> tokio::process::Command {
    let zygote = match cfg.warm {
        Warm::Python => PythonCommand::parse(&cfg.command).map(|p| p.zygote()),
        Warm::Cold | Warm::Command => None,
    };
    let command = zygote.as_deref().unwrap_or(&cfg.command);
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]).envs(grpc_fork_support(cfg)).envs(&cfg.env);
    if let Some(dir) = &cfg.working_dir {
        cmd.current_dir(dir);
    }
    dies_with_driver(&mut cmd, libc::SIGKILL);
    cmd
}

/// A rank's process, from spawn to exit.
struct RankExit {
    rank: u32,
    status: std::io::Result<std::process::ExitStatus>,
}

/// Where ranks report: the URL they dial and, over TLS, the
/// authority the driver's certificate is signed by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReportTo<'a> {
    pub(crate) url: &'a str,
    pub(crate) ca: Option<&'a str>,
}

/// The plan's settings for a launch of `spec` by an engine configured
/// with `cfg`, ranks reporting to `driver` and meeting at `rendezvous`
/// (a fresh file of this launch, where the nodes share files).
pub(crate) fn plan_settings(cfg: &ProcessConfig, spec: &LaunchSpec, driver: ReportTo<'_>, rendezvous: Option<&Path>) -> PlanSettings {
    let (name, storage) = experiment_of(cfg, spec);
    let store = ranks_upload(spec).then(|| spec.storage.uri(""));
    PlanSettings {
        trial: TrialPlan {
            id: spec.trial_id.clone(),
            dir: spec.trial_dir.clone(),
            config: spec.config.clone(),
            start_iteration: spec.start_iteration,
            checkpoint_frequency: spec.checkpoint_frequency,
            experiment_name: name,
            storage_path: storage,
        },
        world: WorldPlan {
            size: spec.world_size(),
            use_gpu: cfg.use_gpu,
            torch_backend: cfg.torch.backend_for(cfg.use_gpu).as_str().to_string(),
            collective_timeout_s: cfg.torch.timeout_s,
        },
        channel: ChannelPlan { addr: driver.url.to_string(), tls_ca: driver.ca.map(str::to_string) },
        checkpoint: spec.checkpoint.clone(),
        checkpoint_uri: spec.checkpoint_uri.clone().filter(|_| store.is_some()),
        store,
        uploader: nestor_binary(),
        rendezvous_file: rendezvous.map(Path::to_path_buf),
        datasets: spec.datasets.clone(),
        preemption: None,
    }
}

/// The variables every rank of a run gets alike: the plan and the token,
/// where the ranks meet by torchrun's names (`MASTER_ADDR`, `MASTER_PORT`;
/// an empty address is left to the engine's script), and the switches
/// frameworks and gRPC read.
pub(crate) fn common_env(cfg: &ProcessConfig, plan: &RunPlan, token: &str, master_addr: &str, master_port: u16) -> Vec<(String, String)> {
    let master = (!master_addr.is_empty()).then(|| ("MASTER_ADDR".to_string(), master_addr.to_string()));
    master
        .into_iter()
        .chain([("MASTER_PORT".to_string(), master_port.to_string())])
        .chain(plan.env(token))
        .chain(accelerate_on_cpus(cfg, plan.world.size))
        .chain(grpc_fork_support(cfg))
        .collect()
}

/// gRPC's own fork handling off in the ranks (and the warm process they
/// are forked from). A rank's report channel has gRPC's threads running;
/// with the handling on, a fork while one of them is inside gRPC (a
/// `DataLoader` starting its worker processes, every epoch for
/// non-persistent ones) skips gRPC's handlers and leaves the child's copy
/// of gRPC broken: the worker dies ("DataLoader worker exited
/// unexpectedly"). Off, a child that never uses gRPC (a data loader's
/// worker, a `multiprocessing` pool) is a plain fork. The warm process
/// only imports gRPC before it forks a rank; each rank opens its own
/// channel. A setting of the user's (`[trainer] env`) wins.
fn grpc_fork_support(cfg: &ProcessConfig) -> Option<(String, String)> {
    (!cfg.env.contains_key("GRPC_ENABLE_FORK_SUPPORT")).then(|| ("GRPC_ENABLE_FORK_SUPPORT".to_string(), "false".to_string()))
}

/// Hugging Face Accelerate's switch for ranks without GPUs: without it an
/// `Accelerator()` on CPUs is not distributed (each rank would train on
/// all the data alone, `num_processes` 1), even under torchrun.
fn accelerate_on_cpus(cfg: &ProcessConfig, world_size: u32) -> Option<(String, String)> {
    (!cfg.use_gpu && world_size > 1 && !cfg.env.contains_key("ACCELERATE_USE_CPU"))
        .then(|| ("ACCELERATE_USE_CPU".to_string(), "true".to_string()))
}

/// The experiment's name and where it is stored (`<storage>/<name>/trials/<id>`
/// is the trial's directory), for the ranks' `TrainContext`; a front end
/// that set them (the Python driver: its `storage_path` may be a bucket)
/// keeps its own (`NESTOR_EXPERIMENT_NAME`, `NESTOR_STORAGE_PATH` in its `env`).
fn experiment_of(cfg: &ProcessConfig, spec: &LaunchSpec) -> (String, String) {
    let exp_dir = spec.trial_dir.parent().and_then(Path::parent);
    let name = exp_dir.and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let storage = exp_dir.and_then(Path::parent).map(|p| p.display().to_string()).unwrap_or_default();
    (cfg.env.get("NESTOR_EXPERIMENT_NAME").cloned().unwrap_or(name), cfg.env.get("NESTOR_STORAGE_PATH").cloned().unwrap_or(storage))
}

/// Whether ranks upload their checkpoint shards to the trial's object
/// store themselves, and restore from it (with the store's credentials
/// from the environment they inherit): not for local storage, nor with
/// `NESTOR_RANKS_UPLOAD=0` in the driver's environment (nodes without
/// credentials for the store: every byte through the driver).
fn ranks_upload(spec: &LaunchSpec) -> bool {
    !spec.storage.is_local() && ranks_reach_store()
}

/// Unless `NESTOR_RANKS_UPLOAD=0` says the nodes have no credentials for the store.
pub(crate) fn ranks_reach_store() -> bool {
    !std::env::var("NESTOR_RANKS_UPLOAD").is_ok_and(|v| v == "0")
}

/// This process's binary when it is `nestor` (the driver), for what ranks
/// and jobs run of it (`put-shard`, `relay-output`).
pub(crate) fn nestor_binary() -> Option<String> {
    std::env::current_exe().ok().filter(|exe| exe.file_name().is_some_and(|n| n == "nestor")).map(|exe| exe.display().to_string())
}

/// What the process engine's ranks see: this machine's directories, unless
/// `NESTOR_NODE_VIEW=unshared` (in `[trainer] env`, else the driver's
/// environment) has them take the routes of nodes that share no directory
/// with the driver (checkpoints shipped and fetched through the channel,
/// the ranks meeting through the driver): a cluster's routes, tried on one machine.
fn local_view(cfg: &ProcessConfig) -> Result<NodeView, LaunchError> {
    let set = cfg.env.get(NODE_VIEW_VAR).cloned().or_else(|| std::env::var(NODE_VIEW_VAR).ok());
    match set.as_deref() {
        None | Some("" | "shared") => Ok(NodeView::Shared),
        Some("unshared") => Ok(NodeView::Unshared),
        Some(other) => Err(LaunchError::Refused(format!("{NODE_VIEW_VAR}={other:?}: give shared or unshared"))),
    }
}

/// The setting of [`local_view`].
pub const NODE_VIEW_VAR: &str = "NESTOR_NODE_VIEW";

/// The variables of one rank on this machine, beside the common ones:
/// its place by torchrun's names, its devices and threads.
fn rank_env(cfg: &ProcessConfig, spec: &LaunchSpec, rank: u32, common: &[(String, String)]) -> Vec<(String, String)> {
    let bundle = spec.bundle(rank);
    let world = spec.world_size().to_string();
    let mut env: Vec<(String, String)> = cfg.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    env.extend(common.iter().cloned());
    env.extend(
        [
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", world.clone()),
            ("LOCAL_RANK", rank.to_string()),
            ("LOCAL_WORLD_SIZE", world),
            ("GROUP_RANK", "0".to_string()),
            ("NODE_RANK", "0".to_string()),
            ("CUDA_VISIBLE_DEVICES", bundle.cuda_visible_devices()),
            ("OMP_NUM_THREADS", bundle.omp_threads().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v)),
    );
    env
}

impl ProcessBackend {
    fn command(cfg: &ProcessConfig, env: &[(String, String)], log_path: &Path) -> Result<tokio::process::Command, LaunchError> {
        let open_log = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log_path)
                .map_err(|source| LaunchError::Io { path: log_path.to_path_buf(), source })
        };
        let (stdout, stderr) = (open_log()?, open_log()?);
        let mut cmd = tokio::process::Command::new(&cfg.command[0]);
        cmd.args(&cfg.command[1..])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(false);
        if let Some(dir) = &cfg.working_dir {
            cmd.current_dir(dir);
        }
        dies_with_driver(&mut cmd, libc::SIGKILL);
        Ok(cmd)
    }
}

impl Backend for ProcessBackend {
    /// Ranks restore from the store themselves (one that cannot reach it
    /// gets its shard from the driver, which downloads the checkpoint then).
    fn restores_from_store(&self) -> bool {
        ranks_reach_store()
    }

    /// Starts one process per rank, each in its own process group, with the
    /// torchrun variables, its bundle's `CUDA_VISIBLE_DEVICES` and
    /// `OMP_NUM_THREADS`, and the `NESTOR_*` variables (forked from the warm
    /// process when `warm` is set). When a rank exits non-zero or dies, the
    /// others are stopped at once (SIGTERM, then SIGKILL after at most a
    /// second) and the run fails with that rank's log tail.
    fn launch(&self, spec: LaunchSpec, events: mpsc::UnboundedSender<Event>) -> Result<TrialHandle, LaunchError> {
        let blob = (self.config.warm != Warm::Cold).then(String::new);
        self.launch_with(&self.config, spec, events, blob)
    }

    /// A trainer inside a trial: its ranks run `program` and report to this
    /// backend's server, which serves its files too. A program that is the
    /// sweep's warm worker command with another last argument (the Python
    /// driver's: another pickled function) forks from the sweep's warm
    /// process, which loads that function (each rank in its own working
    /// directory, as forked ranks are); any other starts a process per rank.
    fn launch_inner(
        &self,
        spec: LaunchSpec,
        program: &ProcessConfig,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<TrialHandle, LaunchError> {
        let cfg = ProcessConfig { report_bind: self.config.report_bind, encrypt: self.config.encrypt, warm: Warm::Cold, ..program.clone() };
        self.server.add_files(&cfg.files);
        let (ours, theirs) = (&self.config.command, &cfg.command);
        let forks = self.config.warm == Warm::Command
            && ours.len() == theirs.len()
            && ours.len() > 1
            && ours[..ours.len() - 1] == theirs[..theirs.len() - 1];
        let blob = forks.then(|| theirs.last().cloned().unwrap_or_default());
        self.launch_with(&cfg, spec, events, blob)
    }
}

impl ProcessBackend {
    /// Launches `spec`'s ranks running `cfg`: forked from the warm process
    /// when `warm_blob` is set (empty: the warm process's own function).
    fn launch_with(
        &self,
        cfg: &ProcessConfig,
        spec: LaunchSpec,
        events: mpsc::UnboundedSender<Event>,
        warm_blob: Option<String>,
    ) -> Result<TrialHandle, LaunchError> {
        let program = cfg.command.first().cloned().unwrap_or_default();
        let logs = spec.trial_dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|source| LaunchError::Io { path: logs.clone(), source })?;
        let token = random_token();
        let key = crate::token::run_key();
        let world_size = spec.world_size();
        let master_port = free_port();
        let log_paths: Vec<PathBuf> = (0..world_size).map(|r| logs.join(format!("rank-{r}.log"))).collect();
        // A fresh file per launch: a store file left by an earlier run would hold its keys.
        let rendezvous = logs.join(format!(".rendezvous-{key}"));
        let view = local_view(cfg)?;
        let rendezvous_file = (view == NodeView::Shared).then_some(rendezvous.as_path());
        let plan =
            RunPlan::new(plan_settings(cfg, &spec, ReportTo { url: &self.server.url(), ca: self.server.ca_pem() }, rendezvous_file), &view);
        let common = common_env(cfg, &plan, &token, "127.0.0.1", master_port);
        let envs: Vec<_> = (0..world_size).map(|rank| rank_env(cfg, &spec, rank, &common)).collect();
        let roots = spec.roots(cfg.working_dir.as_deref());
        let trial_id = spec.trial_id.clone();
        // What the node's GPU sampler counts towards this trial: its bundles' GPUs, its ranks' groups.
        let gpu = Arc::clone(self.server.gpu_usage());
        let gpus: Vec<u32> = (0..world_size).flat_map(|r| spec.bundle(r).gpus).collect();
        let trial = spec.trial_id.clone();
        let monitor = |groups, stop, registration| Monitor {
            groups,
            stop,
            registration,
            grace: cfg.grace_period,
            trial_id,
            log_paths: log_paths.clone(),
            rendezvous: rendezvous.clone(),
            oom_at_start: OomKills::now(),
        };
        if let Some(blob) = warm_blob {
            let zygote = &*self.config;
            let queue =
                self.warm.queue(|| warm_command(zygote)).map_err(|source| LaunchError::Spawn { program: program.clone(), source })?;
            let blob = (!blob.is_empty()).then_some(blob);
            let registration = self.server.register(&spec, token, roots, events.clone());
            let (handle, stop) = TrialHandle::new(Vec::new(), Some(Arc::clone(registration.aggregator()) as Arc<dyn StepProgress>));
            let cwd = cfg.working_dir.clone().or_else(|| std::env::current_dir().ok()).unwrap_or_default();
            let groups = Groups::default();
            let monitor = monitor(Arc::clone(&groups), stop, registration);
            supervise(spec.trial_id, events, groups, libc::SIGKILL, async move {
                let (exits_tx, exits) = mpsc::unbounded_channel::<RankExit>();
                for (rank, env) in envs.into_iter().enumerate() {
                    let rank_spec = RankSpec {
                        env: env.into_iter().collect(),
                        cwd: cwd.clone(),
                        log: monitor.log_paths[rank].clone(),
                        blob: blob.clone(),
                    };
                    match queue.fork(rank_spec).await {
                        Ok(forked) => {
                            monitor.add_group(forked.pid);
                            let tx = exits_tx.clone();
                            tokio::spawn(async move {
                                let status =
                                    forked.exit.await.unwrap_or_else(|_| Err(std::io::Error::other("the warm worker process is gone")));
                                let _ = tx.send(RankExit { rank: rank as u32, status });
                            });
                        }
                        Err(e) => {
                            // All or nothing: the ranks that did start go at once.
                            let pgids = monitor.pgids();
                            pgids.iter().for_each(|&g| signal_group(g, libc::SIGKILL));
                            wait_groups_gone(&pgids).await;
                            return ExitOutcome::Failed(format!("cannot start rank {rank}: {e}"));
                        }
                    }
                }
                drop(exits_tx);
                gpu.start(&trial, holding(&gpus, monitor.pgids()));
                let outcome = monitor.run(exits).await;
                gpu.end(&trial);
                outcome
            });
            return Ok(handle);
        }
        let mut commands = Vec::with_capacity(world_size as usize);
        for (rank, env) in envs.iter().enumerate() {
            commands.push(Self::command(cfg, env, &log_paths[rank])?);
        }
        let registration = self.server.register(&spec, token, roots, events.clone());
        let (exits_tx, exits) = mpsc::unbounded_channel::<RankExit>();
        let mut pgids = Vec::with_capacity(commands.len());
        // From this thread only: PR_SET_PDEATHSIG fires when the thread that
        // spawned a child exits, so a short-lived helper thread would take the
        // ranks it started with it.
        let spawned: Vec<_> = commands.iter_mut().map(tokio::process::Command::spawn).collect();
        if let Some(source) = spawned.iter().find_map(|r| r.as_ref().err()) {
            // All or nothing: the ranks that did start go at once.
            let source = std::io::Error::new(source.kind(), source.to_string());
            for child in spawned.iter().filter_map(|r| r.as_ref().ok()) {
                if let Some(pid) = child.id() {
                    signal_group(pid as i32, libc::SIGKILL);
                }
            }
            drop(registration);
            return Err(LaunchError::Spawn { program, source });
        }
        for (rank, child) in spawned.into_iter().enumerate() {
            let Ok(mut child) = child else { continue };
            pgids.push(child.id().map_or(0, |p| p as i32));
            let tx = exits_tx.clone();
            tokio::spawn(async move {
                let status = child.wait().await;
                let _ = tx.send(RankExit { rank: rank as u32, status });
            });
        }
        drop(exits_tx);
        let (handle, stop) = TrialHandle::new(
            pgids.iter().copied().filter(|&g| g > 0).collect(),
            Some(Arc::clone(registration.aggregator()) as Arc<dyn StepProgress>),
        );
        gpu.start(&spec.trial_id, holding(&gpus, pgids.clone()));
        let groups: Groups = Arc::new(std::sync::Mutex::new(pgids));
        let monitor = monitor(Arc::clone(&groups), stop, registration);
        supervise(spec.trial_id, events, groups, libc::SIGKILL, async move {
            let outcome = monitor.run(exits).await;
            gpu.end(&trial);
            outcome
        });
        Ok(handle)
    }
}

/// What a run holds, for the node's GPU figures.
fn holding(gpus: &[u32], groups: Vec<i32>) -> crate::gpu_usage::Holding {
    crate::gpu_usage::Holding { gpus: gpus.iter().copied().collect(), groups: groups.into_iter().filter(|&g| g > 0).collect() }
}

/// A run's ranks from their start to the run's end: one task that waits
/// on every rank, stops the others when one fails, carries out stop
/// requests, and returns the outcome once no process of the run is left.
struct Monitor {
    groups: Groups,
    stop: tokio::sync::watch::Receiver<StopLevel>,
    registration: crate::service::Registration,
    grace: Duration,
    trial_id: String,
    log_paths: Vec<PathBuf>,
    rendezvous: PathBuf,
    /// The OOM killer's counts when the run started: a rank it kills is named as such.
    oom_at_start: OomKills,
}

impl Monitor {
    fn add_group(&self, pgid: i32) {
        self.groups.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(pgid);
    }

    fn pgids(&self) -> Vec<i32> {
        self.groups.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    async fn run(self, mut exits: mpsc::UnboundedReceiver<RankExit>) -> ExitOutcome {
        let pgids = self.pgids();
        let Monitor { stop, registration, grace, trial_id, log_paths, rendezvous, oom_at_start, .. } = self;
        let signal_all = |sig: i32| pgids.iter().filter(|&&g| g > 0).for_each(|&g| signal_group(g, sig));
        let mut stopping = Escalation::new(stop, grace);
        let mut failure: Option<(u32, String)> = None;
        let mut wait_error: Option<String> = None;
        let mut remaining = pgids.len();
        while remaining > 0 {
            tokio::select! {
                exit = exits.recv() => {
                    let Some(RankExit { rank, status }) = exit else { break };
                    remaining -= 1;
                    match status {
                        Ok(s) if s.success() => registration.aggregator().rank_finished(rank),
                        Ok(_) if stopping.asked() > StopLevel::Run => registration.aggregator().fail(),
                        Ok(s) => {
                            registration.aggregator().fail();
                            let how = describe_exit_since(s, oom_at_start);
                            if failure.is_none() && remaining > 0 {
                                tracing::warn!(trial = %trial_id, rank, "{how}; stopping the other ranks");
                                signal_all(libc::SIGTERM);
                                stopping.kill_within(grace.min(Duration::from_secs(1)));
                            }
                            failure.get_or_insert((rank, how));
                        }
                        Err(e) => {
                            registration.aggregator().fail();
                            wait_error.get_or_insert(format!("failed to wait for rank {rank}: {e}"));
                        }
                    }
                }
                step = stopping.next() => match step {
                    StopStep::Terminate => signal_all(libc::SIGTERM),
                    StopStep::Kill => {
                        if stopping.requested < StopLevel::Kill {
                            tracing::warn!(trial = %trial_id, "workers still running after SIGTERM; killing them");
                        }
                        signal_all(libc::SIGKILL);
                    }
                },
            }
        }
        // Whatever the leaders did, no process of the groups outlives the trial.
        signal_all(libc::SIGKILL);
        wait_groups_gone(&pgids).await;
        let _ = std::fs::remove_file(&rendezvous);
        // Its reports are refused from here on.
        drop(registration);
        match (failure, wait_error) {
            (Some((rank, how)), _) => {
                let log = &log_paths[rank as usize];
                let tail = log_tail(log, 20);
                let tail = if tail.is_empty() { String::new() } else { format!("; last log lines ({}):\n{tail}", log.display()) };
                ExitOutcome::Failed(format!("rank {rank} {how}{tail}"))
            }
            (None, Some(e)) => ExitOutcome::Failed(e),
            (None, None) if stopping.asked() > StopLevel::Run => ExitOutcome::Stopped,
            (None, None) => ExitOutcome::Completed,
        }
    }
}
