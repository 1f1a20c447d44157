//! The worker side: what training code sees of its trial, and `report`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::watch;

use crate::backend::{Directive, StopLevel};
use crate::checkpoint::CheckpointError;
use crate::collective::{Collective, CollectiveError, ReduceOp};
use crate::contract::{CheckpointOut, ResumeFrom, RunPlan};
use crate::intake::{Intake, IntakeError};
use crate::proto;
use crate::proto::report_request::Checkpoint as Out;
use crate::shards::{read_chunks, ChunkWriter};

/// Why `report` did not return `Ok`.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The driver decided this trial must stop. Not a failure: return it with
    /// `?` and the trial ends TERMINATED.
    #[error("the trial was told to stop")]
    Stopped,
    /// The checkpoint passed to `report` could not be persisted.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The driver refused the report (wrong token, unknown trial, bad input).
    #[error("report refused: {0}")]
    Refused(String),
    /// The report channel failed, or the driver could not be reached (named).
    #[error("report channel failed: {0}")]
    Transport(String),
    /// The worker environment is missing or malformed (`Context::from_env`).
    #[error("bad worker environment: {0}")]
    Environment(String),
    /// A config value is missing or has the wrong type (`Context::param`).
    #[error("config `{key}`: {message}")]
    Config {
        /// Dotted key.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// A worker's report stream: requests out, one reply each back.
struct Session {
    requests: tokio::sync::mpsc::Sender<proto::ReportRequest>,
    replies: tonic::Streaming<proto::ReportReply>,
}

fn status_error(s: &tonic::Status) -> ReportError {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled => {
            ReportError::Transport(s.message().to_string())
        }
        _ => ReportError::Refused(s.message().to_string()),
    }
}

/// What a failed connection says, down to its root cause ("Connection refused").
fn transport_cause(s: &tonic::Status) -> String {
    let mut why = s.message().to_string();
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(e) = source {
        why = e.to_string();
        source = e.source();
    }
    why
}

/// A call's failure: a driver that cannot be reached is named by `addr`.
fn call_error(s: &tonic::Status, addr: &str) -> ReportError {
    match s.code() {
        tonic::Code::Unavailable if std::error::Error::source(s).is_some() => {
            ReportError::Transport(format!("cannot reach the nestor driver at {addr}: {}", transport_cause(s)))
        }
        _ => status_error(s),
    }
}

/// Ships the shard in `dir` to the driver (`PutShard`) and returns the
/// upload's name, for the report that carries it.
async fn ship_shard(
    client: &mut proto::reporter_client::ReporterClient<tonic::transport::Channel>,
    dir: &Path,
    head: proto::ShardChunk,
    addr: &str,
) -> Result<String, ReportError> {
    if !dir.is_dir() {
        return Err(CheckpointError::NotADirectory(dir.to_path_buf()).into());
    }
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let from = dir.to_path_buf();
    let reader = tokio::task::spawn_blocking(move || read_chunks(&from, head, |c| tx.blocking_send(c).is_ok()));
    let (read, put) = tokio::join!(reader, client.put_shard(tokio_stream::wrappers::ReceiverStream::new(rx)));
    // A shard read in part is never claimed: the driver discards its upload when the run ends.
    read.map_err(|e| ReportError::Transport(e.to_string()))?.map_err(|source| CheckpointError::Io { path: dir.to_path_buf(), source })?;
    Ok(put.map_err(|s| call_error(&s, addr))?.into_inner().upload)
}

/// Fetches this rank's shard of the checkpoint its run resumes from
/// (`GetShard`) into `dest`; `false` when the checkpoint holds none for it.
async fn fetch_shard(
    client: &mut proto::reporter_client::ReporterClient<tonic::transport::Channel>,
    request: proto::ShardRequest,
    dest: &Path,
    addr: &str,
) -> Result<bool, ReportError> {
    let mut chunks = match client.get_shard(request).await {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == tonic::Code::NotFound => return Ok(false),
        Err(s) => return Err(call_error(&s, addr)),
    };
    let mut writer =
        ChunkWriter::new(dest).map_err(|source| ReportError::Checkpoint(CheckpointError::Io { path: dest.to_path_buf(), source }))?;
    while let Some(chunk) = chunks.message().await.map_err(|s| call_error(&s, addr))? {
        writer.write(&chunk).map_err(|e| ReportError::Transport(format!("fetching the checkpoint to resume from: {e}")))?;
    }
    Ok(true)
}

/// Sends one report on the session (opening it first if needed) and waits
/// for its reply; a driver that cannot be reached is named by `addr`.
async fn exchange(
    client: &mut proto::reporter_client::ReporterClient<tonic::transport::Channel>,
    session: &mut Option<Box<Session>>,
    request: proto::ReportRequest,
    addr: &str,
) -> Result<proto::ReportReply, ReportError> {
    if session.is_none() {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let replies = client
            .session(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(|s| match s.code() {
                tonic::Code::Unavailable => {
                    ReportError::Transport(format!("cannot reach the nestor driver at {addr}: {}", transport_cause(&s)))
                }
                _ => status_error(&s),
            })?
            .into_inner();
        *session = Some(Box::new(Session { requests: tx, replies }));
    }
    let Some(s) = session.as_mut() else { return Err(ReportError::Transport("no report stream".into())) };
    let result = match s.requests.send(request).await {
        Ok(()) => match s.replies.message().await {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => Err(ReportError::Transport("the driver closed the report stream".into())),
            Err(status) => Err(status_error(&status)),
        },
        Err(_) => Err(ReportError::Transport("the report stream is closed".into())),
    };
    if result.is_err() {
        // A refusal ends the stream; the next report opens a new one.
        *session = None;
    }
    result
}

/// What the ranks of one in-process run share.
pub(crate) struct Group {
    /// The trial's report intake (the same checks as over gRPC).
    pub(crate) intake: Intake,
    /// The driver's runtime, for uploads to an object store.
    pub(crate) runtime: Option<tokio::runtime::Handle>,
    pub(crate) collective: Collective,
    /// Set when a rank has failed: the others stop at their next report.
    pub(crate) failed: AtomicBool,
    pub(crate) stop: watch::Receiver<StopLevel>,
    /// Reports wait for the loop's decision ([`crate::LaunchSpec::await_decisions`]).
    pub(crate) await_decisions: bool,
}

enum Transport {
    InProcess(Arc<Group>),
    Grpc {
        rt: Box<tokio::runtime::Runtime>,
        client: proto::reporter_client::ReporterClient<tonic::transport::Channel>,
        token: String,
        /// The open report stream (opened on first use, reopened after a refusal).
        session: Option<Box<Session>>,
    },
}

/// A worker's view of its trial: config, rank, checkpoint to resume from,
/// and `report`. The same API for in-process Rust functions and for worker
/// processes (which build it with [`Context::from_env`]).
pub struct Context {
    trial_id: String,
    config: Value,
    trial_dir: PathBuf,
    checkpoint: Option<PathBuf>,
    start_iteration: u64,
    checkpoint_frequency: u64,
    rank: u32,
    local_rank: u32,
    world_size: u32,
    local_world_size: u32,
    node_rank: u32,
    /// The experiment's name and storage (`NESTOR_EXPERIMENT_NAME`, `NESTOR_STORAGE_PATH`; from the trial's directory in process).
    experiment_name: String,
    storage_path: String,
    trial_dir_ready: std::cell::Cell<bool>,
    transport: Transport,
    /// `NESTOR_ADDR` (empty in process), for errors.
    driver_addr: String,
    /// The last step this worker reported, if any.
    last_iteration: Option<u64>,
    /// How far its steps were acknowledged, as last heard.
    acknowledged: u64,
    /// The local copy of a shard fetched from the driver, removed on drop.
    fetched: Option<PathBuf>,
    /// Where a checkpoint goes (the plan's route, after any upload to the store).
    out: CheckpointOut,
    /// The trial's checkpoints in an object store, where this rank uploads
    /// its shards itself (the plan's `Upload` route); None once an upload
    /// failed (it then takes `out`, as without a store).
    store: Option<crate::Storage>,
    /// The experiment's data sets' plan, if it has any.
    datasets: Option<PathBuf>,
}

/// Copies `dir` (synced) to a new `rank-<rank>-<random>` directory below
/// `staging`, where the driver takes it from.
fn stage_shard(dir: &Path, staging: &Path, rank: u32) -> Result<PathBuf, ReportError> {
    if !dir.is_dir() {
        return Err(ReportError::Checkpoint(crate::checkpoint::CheckpointError::NotADirectory(dir.to_path_buf())));
    }
    let name = format!("rank-{rank}-{}", crate::token::random_token().get(..16).unwrap_or_default());
    let dest = staging.join(name);
    std::fs::create_dir_all(&dest)
        .map_err(|source| ReportError::Checkpoint(crate::checkpoint::CheckpointError::Io { path: dest.clone(), source }))?;
    if let Err(e) = crate::checkpoint::copy_tree(dir, &dest) {
        let _ = std::fs::remove_dir_all(&dest);
        return Err(ReportError::Checkpoint(e));
    }
    Ok(dest)
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Some(dir) = self.fetched.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("trial_id", &self.trial_id).field("rank", &self.rank).finish_non_exhaustive()
    }
}

/// The experiment's directory of a trial's directory (`<experiment>/trials/<id>`).
fn experiment_dir(trial_dir: &Path) -> Option<&Path> {
    trial_dir.parent().and_then(Path::parent)
}

impl Context {
    pub(crate) fn in_process(spec: &crate::LaunchSpec, rank: u32, group: Arc<Group>) -> Self {
        Self {
            trial_id: spec.trial_id.clone(),
            config: spec.config.clone(),
            trial_dir: spec.trial_dir.clone(),
            checkpoint: spec.checkpoint.as_ref().map(|c| crate::checkpoint::shard_for(c, rank)),
            start_iteration: spec.start_iteration,
            checkpoint_frequency: spec.checkpoint_frequency,
            rank,
            local_rank: rank,
            world_size: spec.world_size(),
            local_world_size: spec.world_size(),
            node_rank: 0,
            experiment_name: experiment_dir(&spec.trial_dir)
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            storage_path: experiment_dir(&spec.trial_dir).and_then(Path::parent).map(|p| p.display().to_string()).unwrap_or_default(),
            trial_dir_ready: std::cell::Cell::new(false),
            transport: Transport::InProcess(group),
            driver_addr: String::new(),
            last_iteration: None,
            acknowledged: spec.start_iteration,
            fetched: None,
            out: CheckpointOut::InPlace,
            store: None,
            datasets: spec.datasets.clone(),
        }
    }

    /// When the cluster said it will end this run soon (a Slurm job of its
    /// own nearing its time limit, `[cluster.jobs] signal_s`), or `None`:
    /// the time to save a checkpoint with the next report, from which the
    /// trial goes on in a new job. Slurm tells every rank at once.
    pub fn preemption_notice(&self) -> Option<std::time::SystemTime> {
        match PREEMPTED_AT.load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            ms => Some(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)),
        }
    }

    /// Builds the context of a worker process from the run's plan nestor
    /// gives it (`NESTOR_RUN`, with the token in `NESTOR_TOKEN`; the older
    /// variables of an experiment started before the plan are read too) and
    /// its place by torchrun's names (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, ...).
    pub fn from_env() -> Result<Self, ReportError> {
        let (plan, token) = RunPlan::from_env().map_err(ReportError::Environment)?;
        let num = |k: &str, default: u32| -> Result<u32, ReportError> {
            match std::env::var(k) {
                Ok(v) => v.parse().map_err(|_| ReportError::Environment(format!("{k}={v:?} is not a number"))),
                Err(_) => Ok(default),
            }
        };
        if plan.preemption.as_ref().is_some_and(|p| p.signal == "USR1") {
            watch_preemption();
        }
        let rank = num("RANK", 0)?;
        let local_rank = num("LOCAL_RANK", rank)?;
        let world_size = num("WORLD_SIZE", plan.world.size)?;
        let local_world_size = num("LOCAL_WORLD_SIZE", world_size)?;
        let node_rank = num("NODE_RANK", 0)?;
        let routes = plan.routes_here(Path::exists).clone();
        let RunPlan { trial, channel, datasets, .. } = plan;
        let addr = channel.addr;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| ReportError::Transport(e.to_string()))?;
        let endpoint = crate::tls::endpoint(&addr, channel.tls_ca.as_deref())
            .map_err(ReportError::Environment)?
            .connect_timeout(Duration::from_secs(10))
            .initial_stream_window_size(Some(4 << 20))
            .initial_connection_window_size(Some(16 << 20));
        let channel = {
            let _guard = rt.enter();
            endpoint.connect_lazy()
        };
        let mut client = proto::reporter_client::ReporterClient::new(channel);
        let scratch = || std::env::temp_dir().join(format!("nestor-{}-rank-{rank}-{}", trial.id, std::process::id()));
        // A node that cannot read the driver's copy of the checkpoint gets its shard from the driver.
        let from_driver = |client: &mut proto::reporter_client::ReporterClient<tonic::transport::Channel>| {
            let dest = scratch();
            let request = proto::ShardRequest {
                version: 1,
                trial_id: trial.id.clone(),
                token: token.clone(),
                rank,
                path: String::new(),
                whole: false,
            };
            let _ = std::fs::remove_dir_all(&dest);
            match rt.block_on(fetch_shard(client, request, &dest, &addr)) {
                Ok(true) => Ok((Some(dest.clone()), Some(dest))),
                Ok(false) => Ok((None, None)),
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dest);
                    Err(e)
                }
            }
        };
        let (checkpoint, fetched) = match &routes.back {
            ResumeFrom::None => (None, None),
            ResumeFrom::Local { checkpoint } => (Some(crate::checkpoint::shard_for(checkpoint, rank)), None),
            ResumeFrom::Driver => from_driver(&mut client)?,
            // A rank that reaches the store reads its shard from it, without the driver; one
            // that does not gets it from the driver, which downloads it then.
            ResumeFrom::Store { uri, .. } => {
                let dest = scratch();
                let _ = std::fs::remove_dir_all(&dest);
                let location = uri.rsplit_once('/').map_or(uri.as_str(), |(parent, _)| parent);
                let direct = match crate::Storage::parse(location) {
                    Ok(storage) => rt.block_on(storage.fetch_shard(uri, rank, &dest)).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match direct {
                    Ok(true) => (Some(dest.clone()), Some(dest)),
                    Ok(false) => (None, None),
                    Err(why) => {
                        let _ = std::fs::remove_dir_all(&dest);
                        eprintln!(
                            "nestor: rank {rank} cannot download its checkpoint shard from {uri} ({why}); it comes through the driver"
                        );
                        from_driver(&mut client)?
                    }
                }
            }
        };
        let (store, out) = match routes.out {
            CheckpointOut::Upload { store, otherwise, .. } => (crate::Storage::parse(&store).ok(), *otherwise),
            out => (None, out),
        };
        if out == CheckpointOut::Ship {
            // The trial's directory is the driver's; on this node it is one of the same path, made here.
            let _ = std::fs::create_dir_all(&trial.dir);
        }
        Ok(Self {
            trial_id: trial.id,
            config: trial.config,
            trial_dir: trial.dir,
            checkpoint,
            start_iteration: trial.start_iteration,
            checkpoint_frequency: trial.checkpoint_frequency,
            rank,
            local_rank,
            world_size,
            local_world_size,
            node_rank,
            experiment_name: trial.experiment_name,
            storage_path: trial.storage_path,
            trial_dir_ready: std::cell::Cell::new(false),
            transport: Transport::Grpc { rt: Box::new(rt), client, token, session: None },
            driver_addr: addr,
            last_iteration: None,
            acknowledged: trial.start_iteration,
            fetched,
            out,
            store,
            datasets,
        })
    }

    /// The driver's plan of the data set `name` of the experiment's
    /// `[datasets]`: its blocks and their rows. A rank whose node does not
    /// see the plan file fetches it from the driver. Reading a rank's
    /// share of it is nestor-data's `dataset_shard` (Ray Train's
    /// `get_dataset_shard`), which starts from this plan.
    pub fn dataset_plan(&mut self, name: &str) -> Result<crate::data::DataPlan, crate::data::DataError> {
        use crate::data::DataError;
        let Some(path) = self.datasets.clone() else {
            return Err(DataError::Unknown { name: name.to_string(), known: "none: the experiment has no [datasets]".into() });
        };
        let mut plans = if path.exists() {
            crate::data::read_plans(&path)?
        } else {
            let fetched = self.fetch_file(&path).map_err(|e| DataError::Plan { path: path.clone(), message: e.to_string() })?;
            let plans = crate::data::read_plans(&fetched);
            let _ = std::fs::remove_file(&fetched);
            plans?
        };
        let Some(plan) = plans.datasets.remove(name) else {
            let known = plans.datasets.keys().cloned().collect::<Vec<_>>().join(", ");
            return Err(DataError::Unknown { name: name.to_string(), known });
        };
        Ok(plan)
    }

    /// Fetches `path` (one of the files the driver serves) into a temporary
    /// file of this node; the caller removes it.
    fn fetch_file(&mut self, path: &Path) -> Result<PathBuf, ReportError> {
        let Transport::Grpc { rt, client, token, .. } = &mut self.transport else {
            return Err(ReportError::Environment(format!("{} does not exist", path.display())));
        };
        let request = proto::ShardRequest {
            version: 1,
            trial_id: self.trial_id.clone(),
            token: token.clone(),
            rank: self.rank,
            path: path.display().to_string(),
            whole: false,
        };
        let dest = std::env::temp_dir().join(format!(
            "nestor-{}-rank-{}-{}-{}",
            self.trial_id,
            self.rank,
            std::process::id(),
            crate::token::random_token().get(..8).unwrap_or_default()
        ));
        let addr = self.driver_addr.clone();
        let got: Result<Vec<u8>, ReportError> = rt.block_on(async {
            let mut chunks = client.get_file(request).await.map_err(|s| call_error(&s, &addr))?.into_inner();
            let mut out = Vec::new();
            while let Some(chunk) = chunks.message().await.map_err(|s| call_error(&s, &addr))? {
                out.extend_from_slice(&chunk.data);
            }
            Ok(out)
        });
        std::fs::write(&dest, got?).map_err(|e| ReportError::Transport(format!("{}: {e}", dest.display())))?;
        Ok(dest)
    }

    /// The trial's id.
    pub fn trial_id(&self) -> &str {
        &self.trial_id
    }

    /// The trial's config (a JSON object).
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// One config value by dotted key (`"lr"`, `"model.width"`), deserialized.
    pub fn param<T: DeserializeOwned>(&self, key: &str) -> Result<T, ReportError> {
        let mut v = &self.config;
        for part in key.split('.') {
            v = v.get(part).ok_or_else(|| ReportError::Config { key: key.to_string(), message: "not in the config".into() })?;
        }
        serde_json::from_value(v.clone()).map_err(|e| ReportError::Config { key: key.to_string(), message: e.to_string() })
    }

    /// This worker's rank (0 for a single-worker trial).
    pub fn world_rank(&self) -> u32 {
        self.rank
    }

    /// This worker's rank on its node (its rank, on one node).
    pub fn local_rank(&self) -> u32 {
        self.local_rank
    }

    /// Number of workers in the trial.
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// Number of the trial's workers on this worker's node.
    pub fn local_world_size(&self) -> u32 {
        self.local_world_size
    }

    /// The index of this worker's node among the trial's nodes (0 on one node).
    pub fn node_rank(&self) -> u32 {
        self.node_rank
    }

    /// The experiment's name (its directory's, below the storage path).
    pub fn experiment_name(&self) -> &str {
        &self.experiment_name
    }

    /// Where the experiment is stored: the directory (or bucket URL) its own directory is in.
    pub fn storage_path(&self) -> &str {
        &self.storage_path
    }

    /// Reduces `data` element-wise across all ranks, in place (every rank
    /// gets the same result). `ReduceOp::Mean` averages gradients.
    /// In-process workers only.
    pub fn all_reduce(&self, data: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError> {
        self.group()?.collective.all_reduce(self.rank, data, op)
    }

    /// Copies rank `root`'s `data` into every rank's `data`.
    pub fn broadcast(&self, data: &mut [f32], root: u32) -> Result<(), CollectiveError> {
        self.group()?.collective.broadcast(self.rank, data, root)
    }

    /// Waits until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<(), CollectiveError> {
        self.group()?.collective.barrier(self.rank)
    }

    fn group(&self) -> Result<&Group, CollectiveError> {
        match &self.transport {
            Transport::InProcess(g) => Ok(g),
            Transport::Grpc { .. } => Err(CollectiveError::NotInProcess),
        }
    }

    /// The trial's directory (`<experiment>/trials/<id>`), created on first use.
    pub fn trial_dir(&self) -> &Path {
        if !self.trial_dir_ready.get() {
            // A failure shows up when the caller writes there.
            let _ = std::fs::create_dir_all(&self.trial_dir);
            self.trial_dir_ready.set(true);
        }
        &self.trial_dir
    }

    /// Iterations already done when this run started (those of the
    /// checkpoint it resumed from); its first report is `start_iteration + 1`.
    pub fn start_iteration(&self) -> u64 {
        self.start_iteration
    }

    /// How often, in iterations, this trial should save a checkpoint
    /// (`[checkpoint] frequency`, which schedulers that pause trials
    /// require); 0 when the experiment leaves it to the trainable.
    pub fn checkpoint_frequency(&self) -> u64 {
        self.checkpoint_frequency
    }

    /// Whether iteration `iteration` should carry a checkpoint under
    /// [`Context::checkpoint_frequency`] (never when it is 0).
    pub fn should_checkpoint(&self, iteration: u64) -> bool {
        self.checkpoint_frequency > 0 && iteration.is_multiple_of(self.checkpoint_frequency)
    }

    /// The checkpoint to resume from (this rank's shard), when the trial is
    /// restarted or resumed from one.
    pub fn checkpoint(&self) -> Option<&Path> {
        self.checkpoint.as_deref()
    }

    /// Reports one training step: metrics, and optionally a directory holding
    /// this step's checkpoint (copied by nestor before this returns, so the
    /// directory may be reused afterwards).
    ///
    /// Every rank reports every step; rank 0's metrics are the trial's. Blocks
    /// until all ranks have reported this step, the result is stored and the
    /// scheduler has decided; it is durable with the driver's next group
    /// commit ([`Context::acknowledged_iteration`], [`Context::sync`]).
    /// Where nothing can be decided on a result but to go on (a FIFO
    /// scheduler and no stopper), an in-process rank does not wait for the
    /// decision: it goes on once its report is taken (its checkpoint
    /// copied), and a stop (Ctrl-C, the time budget, a result without the
    /// metric) is returned by its next report.
    /// Returns [`ReportError::Stopped`] when the trial must stop: end
    /// training with `?`.
    pub fn report<I, K>(&mut self, metrics: I, checkpoint: Option<&Path>) -> Result<(), ReportError>
    where
        I: IntoIterator<Item = (K, f64)>,
        K: Into<String>,
    {
        let metrics: BTreeMap<String, f64> = metrics.into_iter().map(|(k, v)| (k.into(), v)).collect();
        let directive = match &mut self.transport {
            Transport::InProcess(group) => {
                // Another rank failed: this run is over (its error is that rank's).
                if group.failed.load(Ordering::Acquire) {
                    return Err(ReportError::Stopped);
                }
                let submit = group.intake.submit(self.rank, metrics, None, checkpoint.map(crate::intake::Shard::Dir));
                let (iteration, rx) = block_on(group.runtime.as_ref(), submit)?.map_err(|e| match e {
                    IntakeError::Refused(msg) => ReportError::Refused(msg),
                    IntakeError::Checkpoint(e) => ReportError::Checkpoint(e),
                })?;
                self.last_iteration = Some(iteration);
                // Where the loop can only answer Continue, the answer is not waited for:
                // a stop comes as a stop request, read below.
                let directive = if group.await_decisions { rx.blocking_recv().unwrap_or(Directive::Stop) } else { Directive::Continue };
                if *group.stop.borrow() > StopLevel::Run {
                    Directive::Stop
                } else {
                    directive
                }
            }
            Transport::Grpc { rt, client, token, session } => {
                let mut out = None;
                let iteration = self.last_iteration.map_or(self.start_iteration, |i| i) + 1;
                let mut checkpoint = checkpoint;
                if let (Some(dir), Some(store)) = (checkpoint, &self.store) {
                    // Straight to the object store, in parallel with the other ranks.
                    match rt.block_on(store.upload_shard(dir, iteration, self.rank)) {
                        Ok(uri) => {
                            out = Some(Out::CheckpointUploaded(uri));
                            checkpoint = None;
                        }
                        Err(e) => {
                            eprintln!(
                                "nestor: rank {} cannot upload to {} ({e}); its checkpoints go through the driver",
                                self.rank,
                                store.uri("")
                            );
                            self.store = None;
                        }
                    }
                }
                match (checkpoint, &self.out) {
                    (None, _) => {}
                    (Some(dir), CheckpointOut::Ship) => {
                        let head = proto::ShardChunk {
                            version: 1,
                            trial_id: self.trial_id.clone(),
                            token: token.clone(),
                            rank: self.rank,
                            ..proto::ShardChunk::default()
                        };
                        out = Some(Out::CheckpointUpload(rt.block_on(ship_shard(client, dir, head, &self.driver_addr))?));
                    }
                    (Some(dir), CheckpointOut::Stage { dir: staging }) => {
                        out = Some(Out::CheckpointStagedDir(stage_shard(dir, staging, self.rank)?.to_string_lossy().into_owned()));
                    }
                    (Some(dir), CheckpointOut::InPlace | CheckpointOut::Upload { .. }) => {
                        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
                        out = Some(Out::CheckpointDir(dir.to_string_lossy().into_owned()));
                    }
                }
                let request = proto::ReportRequest {
                    version: 1,
                    trial_id: self.trial_id.clone(),
                    token: token.clone(),
                    rank: self.rank,
                    metrics: metrics.into_iter().collect(),
                    checkpoint: out,
                    checkpoint_staged: false,
                    extra: String::new(),
                };
                let reply = rt.block_on(exchange(client, session, request, &self.driver_addr))?;
                self.last_iteration = Some(reply.training_iteration);
                self.acknowledged = self.acknowledged.max(reply.acknowledged_iteration);
                match proto::Directive::try_from(reply.directive) {
                    Ok(proto::Directive::Continue) => Directive::Continue,
                    _ => Directive::Stop,
                }
            }
        };
        match directive {
            Directive::Continue => Ok(()),
            Directive::Stop => Err(ReportError::Stopped),
        }
    }

    /// Every step of this run up to this iteration is durable in the
    /// driver's result store (acknowledged), as last heard from the driver:
    /// it trails the steps reported by about one group commit.
    pub fn acknowledged_iteration(&self) -> u64 {
        match &self.transport {
            Transport::InProcess(group) => group.intake.aggregator().acknowledged_through().max(self.acknowledged),
            Transport::Grpc { .. } => self.acknowledged,
        }
    }

    /// Waits until every step this worker has reported is durable in the
    /// driver's result store, and returns how far its steps are
    /// acknowledged (its last step, unless a refused report ended its
    /// stream before the driver could say). Nothing needs it to
    /// end a trial (the driver records a trial's end only after its
    /// results); it is for code that must know, such as a step that deletes
    /// its own copy of something once the driver holds it.
    pub fn sync(&mut self) -> Result<u64, ReportError> {
        let Some(iteration) = self.last_iteration else { return Ok(self.acknowledged) };
        match &mut self.transport {
            Transport::InProcess(group) => {
                let mut acks = group.intake.aggregator().acknowledged();
                block_on(group.runtime.as_ref(), async move { acks.wait_for(iteration).await })?
                    .map_err(|e| ReportError::Transport(e.to_string()))?;
            }
            Transport::Grpc { rt, session, .. } => {
                // No stream open (a refusal ended it, or it was synced already): what was heard is all there is.
                let Some(s) = session.take() else { return Ok(self.acknowledged) };
                // Closing our side: the driver ends the stream once all of it is durable.
                let Session { requests, mut replies } = *s;
                drop(requests);
                loop {
                    match rt.block_on(replies.message()) {
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(status) => return Err(status_error(&status)),
                    }
                }
            }
        }
        self.acknowledged = self.acknowledged.max(iteration);
        Ok(iteration)
    }
}

/// Runs `f` to completion on the driver's runtime, or on one of its own
/// when the worker has none.
fn block_on<F: std::future::Future>(runtime: Option<&tokio::runtime::Handle>, f: F) -> Result<F::Output, ReportError> {
    match runtime {
        Some(rt) => Ok(rt.block_on(f)),
        None => Ok(tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ReportError::Transport(e.to_string()))?
            .block_on(f)),
    }
}

/// When SIGUSR1 came (ms since the epoch; 0: not yet).
static PREEMPTED_AT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn on_preemption_signal(_: libc::c_int) {
    // Async-signal-safe: a clock read and an atomic store.
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_millis() as u64).max(1);
    let _ = PREEMPTED_AT.compare_exchange(0, ms, std::sync::atomic::Ordering::Relaxed, std::sync::atomic::Ordering::Relaxed);
}

/// SIGUSR1 (Slurm's notice before a job's time limit) is recorded for
/// [`Context::preemption_notice`] instead of ending the process.
fn watch_preemption() {
    // SAFETY: the handler only reads the clock and stores an atomic.
    unsafe {
        libc::signal(libc::SIGUSR1, on_preemption_signal as *const () as libc::sighandler_t);
    }
}
