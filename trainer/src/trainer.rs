//! `Trainer`: one data-parallel training run on its own, without a sweep
//! (Ray Train's `TorchTrainer(...).fit()`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::backend::{Backend, Directive, EventKind, ExitOutcome, LaunchSpec, StopLevel};
use crate::command::ProcessConfig;
use crate::context::Context;
use crate::function::{FunctionBackend, TrainResult};
use crate::process::ProcessBackend;
use crate::resources::{NodeResources, Request, ResourceError, ResourcePool};
use crate::scaling::{FailureConfig, ScalingConfig, ScalingError};

/// What each worker of a run executes.
#[derive(Debug, Clone)]
pub enum TrainLoop {
    /// A Rust function, one thread per rank.
    Function(FunctionBackend),
    /// An external command, one process per rank.
    Process(ProcessConfig),
}

/// One training run: a train loop, its scaling, its config.
///
/// ```no_run
/// use trainer::{ReduceOp, ScalingConfig, Trainer};
///
/// let out = Trainer::function(|ctx| {
///     let mut grad = vec![ctx.world_rank() as f32; 4];
///     for step in 0..10 {
///         ctx.all_reduce(&mut grad, ReduceOp::Mean)?;       // data-parallel across the workers
///         ctx.report([("loss", 1.0 / (step + 1) as f64)], None)?;
///     }
///     Ok(())
/// })
/// .scaling(ScalingConfig::workers(2))
/// .config(serde_json::json!({ "lr": 0.01 }))
/// .fit()?;
/// println!("{:?} {:?}", out.metrics, out.checkpoint);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Trainer {
    train_loop: TrainLoop,
    scaling: ScalingConfig,
    config: Value,
    storage: PathBuf,
    name: Option<String>,
    resources: Option<NodeResources>,
    resume_from: Option<PathBuf>,
    failure: FailureConfig,
}

/// A [`Trainer`] taken apart for a sweep ([`Trainer::into_parts`]).
#[derive(Debug, Clone)]
pub struct TrainerParts {
    /// What each rank runs.
    pub train_loop: TrainLoop,
    /// Workers and what each needs.
    pub scaling: ScalingConfig,
    /// The config the trainer was given (a JSON object, or null).
    pub config: Value,
    /// Its run's name, if set.
    pub name: Option<String>,
    /// Where its runs go.
    pub storage: PathBuf,
    /// Restarts after failures, hang detection.
    pub failure: FailureConfig,
}

/// One step of a finished run.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// 1-based iteration.
    pub training_iteration: u64,
    /// Rank 0's metrics.
    pub metrics: BTreeMap<String, f64>,
    /// The step's checkpoint directory, if it had one.
    pub checkpoint: Option<PathBuf>,
}

/// What a finished run leaves: Ray Train's `Result`.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOutput {
    /// The last step's metrics.
    pub metrics: Option<BTreeMap<String, f64>>,
    /// Every step, in order.
    pub history: Vec<Step>,
    /// The latest checkpoint (`.../checkpoint_NNNNNN`, a shard per rank).
    pub checkpoint: Option<PathBuf>,
    /// The run's directory: logs, `result.jsonl`, checkpoints.
    pub path: PathBuf,
    /// How many times the workers failed and were restarted from the
    /// latest checkpoint.
    pub failures: u32,
}

/// Why a run did not complete.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The scaling config breaks a rule.
    #[error("scaling config: {0}")]
    Scaling(#[from] ScalingError),
    /// The workers can never fit on the node.
    #[error(transparent)]
    Resources(#[from] ResourceError),
    /// The workers could not start.
    #[error(transparent)]
    Launch(#[from] crate::LaunchError),
    /// A file or the runtime failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The run's directory exists already.
    #[error("run directory {0} already exists; pick another name")]
    Exists(PathBuf),
    /// A worker failed; the message names the rank, with its log tail.
    #[error("training failed: {message}")]
    Failed {
        /// The failure.
        message: String,
        /// What the run reported before it failed.
        output: Box<TrainOutput>,
    },
    /// Stopped by Ctrl-C.
    #[error("training interrupted")]
    Interrupted(Box<TrainOutput>),
}

impl Trainer {
    /// A run of a Rust function on each worker.
    pub fn function<F>(f: F) -> Self
    where
        F: Fn(&mut Context) -> TrainResult + Send + Sync + 'static,
    {
        Self::new(TrainLoop::Function(FunctionBackend::new(f)))
    }

    /// A run of `command` on each worker (one process per rank).
    pub fn command<I, S>(command: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(TrainLoop::Process(ProcessConfig::new(command.into_iter().map(Into::into).collect())))
    }

    /// A run of `train_loop` with one worker and an empty config.
    pub fn new(train_loop: TrainLoop) -> Self {
        Self {
            train_loop,
            scaling: ScalingConfig::default(),
            config: Value::Object(Default::default()),
            storage: PathBuf::from("nestor-runs"),
            name: None,
            resources: None,
            resume_from: None,
            failure: FailureConfig::default(),
        }
    }

    /// Restarts after failures (from the latest checkpoint) and hang
    /// detection, as in a sweep's `[failure]`.
    pub fn failure(mut self, failure: FailureConfig) -> Self {
        self.failure = failure;
        self
    }

    /// Sets the workers and what each needs.
    pub fn scaling(mut self, scaling: ScalingConfig) -> Self {
        self.scaling = scaling;
        self
    }

    /// Sets the config the workers read (`ctx.config()`, `NESTOR_CONFIG`).
    pub fn config(mut self, config: Value) -> Self {
        self.config = config;
        self
    }

    /// Where runs go (default `./nestor-runs`).
    pub fn storage(mut self, dir: impl Into<PathBuf>) -> Self {
        self.storage = dir.into();
        self
    }

    /// The run's name: its directory under the storage (default `train-<time>`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Declares the node's resources instead of detecting them.
    pub fn resources(mut self, node: NodeResources) -> Self {
        self.resources = Some(node);
        self
    }

    /// Starts from a checkpoint (`.../checkpoint_NNNNNN`) of an earlier run.
    pub fn resume_from_checkpoint(mut self, checkpoint: impl Into<PathBuf>) -> Self {
        self.resume_from = Some(checkpoint.into());
        self
    }

    /// What a sweep of this trainer keeps of it: the train loop and scaling,
    /// and the run settings a tuner takes as its defaults (Ray's
    /// `Tuner(trainer)`): the config, the name, the storage and the failure
    /// settings.
    pub fn into_parts(self) -> TrainerParts {
        TrainerParts {
            train_loop: self.train_loop,
            scaling: self.scaling,
            config: self.config,
            name: self.name,
            storage: self.storage,
            failure: self.failure,
        }
    }

    /// Runs to the end. Blocks; builds its own tokio runtime.
    pub fn fit(self) -> Result<TrainOutput, TrainError> {
        let rt = driver_runtime().map_err(|source| TrainError::Io { path: PathBuf::from("<runtime>"), source })?;
        rt.block_on(self.fit_async())
    }

    /// Runs to the end inside an existing tokio runtime.
    pub async fn fit_async(self) -> Result<TrainOutput, TrainError> {
        self.scaling.validate()?;
        let node = self.resources.clone().unwrap_or_else(NodeResources::detect);
        let mut pool = ResourcePool::new(node);
        let request = Request::from_scaling(&self.scaling);
        // The pool is idle: what does not fit now never will.
        let allocation = pool.try_allocate(&request).ok_or_else(|| pool.never_fits(&request))?;
        let name = self.name.clone().unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            format!("train-{t}")
        });
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TrainError::Io { path, source }
        };
        let dir = std::path::absolute(self.storage.join(&name)).map_err(io(&self.storage))?;
        if dir.exists() {
            return Err(TrainError::Exists(dir));
        }
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let backend: Arc<dyn Backend> = match self.train_loop {
            TrainLoop::Function(f) => Arc::new(f),
            TrainLoop::Process(mut c) => {
                c.use_gpu = self.scaling.use_gpu;
                Arc::new(ProcessBackend::start(c).await.map_err(io(Path::new("<report server>")))?)
            }
        };
        let results_path = dir.join("result.jsonl");
        let mut results = crate::ResultFiles::open(&dir, true).map_err(io(&results_path))?;
        let mut out =
            TrainOutput { metrics: None, history: Vec::new(), checkpoint: self.resume_from.clone(), path: dir.clone(), failures: 0 };
        let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).map_err(io(Path::new("<signal>")))?;
        let mut interrupted = false;
        let hang_limit = self.failure.hang_timeout_s.map(Duration::from_secs_f64);
        // Results written so far, across restarts (a result's position in the file).
        let mut seq = 0u64;
        let outcome = loop {
            // One run of the workers; after a failure, the next starts from the latest checkpoint.
            let start_iteration = out.checkpoint.as_deref().and_then(checkpoint_iteration).unwrap_or(0);
            let spec = LaunchSpec {
                trial_id: name.clone(),
                config: self.config.clone(),
                trial_dir: dir.clone(),
                checkpoint: out.checkpoint.clone(),
                start_iteration,
                checkpoint_frequency: 0,
                workers: allocation.workers.clone(),
                storage: crate::Storage::local(&dir),
                checkpoint_uri: None,
                checkpoint_roots: Vec::new(),
                datasets: None,
                await_decisions: true,
            };
            let (tx, mut events) = mpsc::unbounded_channel();
            let handle = backend.launch(spec, tx)?;
            let mut last_step = tokio::time::Instant::now();
            let mut hung: Option<String> = None;
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            let outcome = loop {
                tokio::select! {
                    _ = sigint.recv() => {
                        if interrupted {
                            // Again: kill every worker process (their groups are signalled
                            // before this returns) and give up on threads that do not report.
                            handle.stop(StopLevel::Kill);
                            break ExitOutcome::Stopped;
                        }
                        handle.stop(StopLevel::Graceful);
                        interrupted = true;
                    }
                    _ = tick.tick(), if hang_limit.is_some() && hung.is_none() => {
                        if hang_limit.is_some_and(|limit| last_step.elapsed() >= limit) {
                            let after = out.history.last().map_or(start_iteration, |s| s.training_iteration);
                            let limit = self.failure.hang_timeout_s.unwrap_or(0.0);
                            hung = Some(hang_message(limit, after, &handle.lagging_ranks(), &[], &dir.join("logs")));
                            handle.stop(StopLevel::Kill);
                        }
                    }
                    ev = events.recv() => match ev.map(|e| e.kind) {
                        Some(EventKind::Report { report, reply }) => {
                            last_step = tokio::time::Instant::now();
                            // Local storage: the checkpoint's URI is its directory.
                            let checkpoint = report.checkpoint.map(|c| PathBuf::from(c.uri));
                            let mut metrics = report.metrics;
                            metrics.insert("training_iteration".into(), report.training_iteration as f64);
                            let uri = checkpoint.as_ref().map(|c| c.display().to_string());
                            let line = crate::ResultLine {
                                trial_id: &name,
                                seq,
                                training_iteration: report.training_iteration,
                                metrics: &metrics,
                                checkpoint: uri.as_deref(),
                                extra: report.extra.as_ref(),
                            };
                            seq += 1;
                            // Durable before the workers go on.
                            results.append(&line).and_then(|()| results.sync()).map_err(io(&results_path))?;
                            if checkpoint.is_some() {
                                out.checkpoint.clone_from(&checkpoint);
                            }
                            out.metrics = Some(metrics.clone());
                            out.history.push(Step { training_iteration: report.training_iteration, metrics, checkpoint });
                            reply.send(if interrupted { Directive::Stop } else { Directive::Continue }).durable();
                        }
                        // One machine: no node to set aside, no step left behind.
                        Some(EventKind::NodeLost { .. } | EventKind::Stuck) => {}
                        Some(EventKind::Book { reply, .. }) => {
                            let _ = reply.send(Err("a run of a Trainer of its own has no pool to book a trainer's resources from".into()));
                        }
                        Some(EventKind::RunTrainer { updates, .. }) => {
                            let error = Some("a run of a Trainer of its own cannot run a trainer inside it".to_string());
                            let _ = updates.send(crate::inner::TrainerUpdate::Ended { status: "failed".into(), error, failures: 0 });
                        }
                        Some(EventKind::Exited(outcome)) => break outcome,
                        None => break ExitOutcome::Failed("the workers' channel closed".into()),
                    }
                }
            };
            let failure = match (hung, outcome) {
                (Some(msg), _) | (None, ExitOutcome::Failed(msg) | ExitOutcome::Infrastructure(msg)) => msg,
                (None, other) => break other,
            };
            if interrupted || !self.failure.may_restart(out.failures) {
                break ExitOutcome::Failed(failure);
            }
            out.failures += 1;
            // Steps after the checkpoint are done again: the history keeps each iteration once.
            let resumed = out.checkpoint.as_deref().and_then(checkpoint_iteration).unwrap_or(0);
            out.history.retain(|s| s.training_iteration <= resumed);
            out.metrics = out.history.last().map(|s| s.metrics.clone());
            let from = out.checkpoint.as_ref().map_or_else(|| "the start".to_string(), |c| c.display().to_string());
            tracing::warn!(failure = %failure.lines().next().unwrap_or_default(), "workers failed; restarting from {from}");
        };
        pool.release(&allocation);
        match outcome {
            ExitOutcome::Failed(message) | ExitOutcome::Infrastructure(message) => {
                Err(TrainError::Failed { message, output: Box::new(out) })
            }
            _ if interrupted => Err(TrainError::Interrupted(Box::new(out))),
            _ => Ok(out),
        }
    }
}

/// A hung run's failure, as the Tuner and a [`Trainer`] run both say it:
/// how long nothing came, after which iteration, the ranks the next step
/// waits for (with their nodes, where `nodes` names each rank's), and the end
/// of the first one's log (`logs/rank-<r>.log`, when
/// its workers are processes).
pub fn hang_message(limit_s: f64, after_iteration: u64, lagging: &[u32], nodes: &[String], logs: &Path) -> String {
    let mut msg = format!("hung: no report for {limit_s} s (failure.hang_timeout_s) after iteration {after_iteration}");
    if !lagging.is_empty() {
        let ranks: Vec<String> = lagging
            .iter()
            .map(|&r| match nodes.get(r as usize).filter(|n| !n.is_empty()) {
                Some(node) => format!("{r} (on {node})"),
                None => r.to_string(),
            })
            .collect();
        msg.push_str(&format!("; waiting on rank {}", ranks.join(", ")));
    }
    let log = logs.join(format!("rank-{}.log", lagging.first().copied().unwrap_or(0)));
    let tail = crate::log_tail(&log, 20);
    if !tail.is_empty() {
        msg.push_str(&format!("; last log lines ({}):\n{tail}", log.display()));
    }
    msg
}

/// The runtime a blocking `fit` drives its run on: the loop on the calling
/// thread (which spawns the workers, and must outlive them), two workers for
/// the report server and the process monitors.
pub fn driver_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()
}

/// 7 for `.../checkpoint_000007`.
fn checkpoint_iteration(path: &Path) -> Option<u64> {
    crate::inner::checkpoint_iteration(path.to_str()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ReduceOp;

    #[test]
    fn a_data_parallel_function_run_on_its_own() {
        let storage = tempfile::tempdir().unwrap();
        let out = Trainer::function(|ctx| {
            let lr: f64 = ctx.param("lr")?;
            let mut w = 0.0f32;
            let scratch = ctx.trial_dir().join(format!("scratch-{}", ctx.world_rank()));
            std::fs::create_dir_all(&scratch)?;
            for _ in 0..3 {
                // Each rank's gradient differs; the mean is the same everywhere.
                let mut g = [ctx.world_rank() as f32 + 1.0];
                ctx.all_reduce(&mut g, ReduceOp::Mean)?;
                w -= lr as f32 * g[0];
                std::fs::write(scratch.join("w"), w.to_string())?;
                ctx.report([("w", f64::from(w)), ("rank", f64::from(ctx.world_rank()))], Some(&scratch))?;
            }
            Ok(())
        })
        .scaling(ScalingConfig::workers(3))
        .resources(NodeResources::declared(3.0))
        .config(serde_json::json!({ "lr": 0.5 }))
        .storage(storage.path())
        .name("solo")
        .fit()
        .unwrap();
        assert_eq!(out.history.len(), 3);
        let m = out.metrics.unwrap();
        assert_eq!((m["w"], m["rank"], m["training_iteration"]), (-3.0, 0.0, 3.0), "mean gradient 2 x lr 0.5 x 3 steps, rank 0's metrics");
        let ckpt = out.checkpoint.unwrap();
        assert!(ckpt.ends_with("checkpoint_000003"));
        for r in 0..3 {
            assert_eq!(std::fs::read_to_string(ckpt.join(format!("rank-{r}/w"))).unwrap(), "-3", "every rank's shard, in sync");
        }
        assert_eq!(std::fs::read_to_string(out.path.join("result.jsonl")).unwrap().lines().count(), 3);
        // The same files a tuner's trial gets: a header and a row per step.
        let csv = std::fs::read_to_string(out.path.join("progress.csv")).unwrap();
        assert_eq!(csv.lines().next(), Some("trial_id,training_iteration,rank,w"));
        assert_eq!(csv.lines().count(), 4);

        // A failing rank fails the run, naming it; the others stop.
        let err = Trainer::function(|ctx| {
            for step in 0..100 {
                if ctx.world_rank() == 1 && step == 2 {
                    return Err("diverged".into());
                }
                ctx.barrier()?;
                ctx.report([("step", f64::from(step))], None)?;
            }
            Ok(())
        })
        .scaling(ScalingConfig::workers(2))
        .resources(NodeResources::declared(2.0))
        .storage(storage.path())
        .name("fails")
        .fit()
        .unwrap_err();
        match err {
            TrainError::Failed { message, output } => {
                assert_eq!(message, "rank 1: diverged");
                assert_eq!(output.history.len(), 2);
            }
            other => panic!("{other}"),
        }
        let err = Trainer::function(|_| Ok(())).scaling(ScalingConfig::workers(0)).fit().unwrap_err();
        assert_eq!(err.to_string(), "scaling config: num_workers: must be at least 1");
        let err =
            Trainer::function(|_| Ok(())).scaling(ScalingConfig::gpu_workers(1)).resources(NodeResources::declared(2.0)).fit().unwrap_err();
        assert!(matches!(err, TrainError::Resources(ResourceError::NeverFits { .. })), "{err}");
    }

    /// In-process ranks go through the same intake as gRPC workers: the
    /// same report is refused with the same message.
    #[test]
    fn an_in_process_rank_gets_the_refusals_a_grpc_worker_gets() {
        let storage = tempfile::tempdir().unwrap();
        let err = Trainer::function(|ctx| {
            ctx.report([("", 1.0)], None)?;
            Ok(())
        })
        .storage(storage.path())
        .name("bad-metric")
        .fit()
        .unwrap_err();
        match err {
            TrainError::Failed { message, output } => {
                assert_eq!(message, "report refused: invalid metric name \"\"");
                assert!(output.history.is_empty(), "nothing reached the driver");
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn a_failed_run_restarts_from_its_latest_checkpoint() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let storage = tempfile::tempdir().unwrap();
        let failed_once = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&failed_once);
        let out = Trainer::function(move |ctx| {
            // State carried by the checkpoint: the sum of the steps so far.
            let (mut step, mut acc) = (0u64, 0u64);
            if let Some(dir) = ctx.checkpoint() {
                let text = std::fs::read_to_string(dir.join("state"))?;
                let (s, a) = text.split_once(' ').ok_or("bad state")?;
                (step, acc) = (s.parse()?, a.parse()?);
            }
            assert_eq!(step, ctx.start_iteration(), "the run starts where its checkpoint ends");
            let scratch = ctx.trial_dir().join(format!("scratch-{}", ctx.world_rank()));
            std::fs::create_dir_all(&scratch)?;
            while step < 5 {
                step += 1;
                if step == 4 && ctx.world_rank() == 1 && !flag.swap(true, Ordering::SeqCst) {
                    return Err("rank 1 lost its GPU".into());
                }
                acc += step;
                std::fs::write(scratch.join("state"), format!("{step} {acc}"))?;
                ctx.report([("acc", acc as f64)], Some(&scratch))?;
            }
            Ok(())
        })
        .scaling(ScalingConfig::workers(2))
        .resources(NodeResources::declared(2.0))
        .failure(FailureConfig { max_failures: 1, ..Default::default() })
        .storage(storage.path())
        .name("flaky")
        .fit()
        .unwrap();
        assert!(failed_once.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(out.failures, 1);
        let iters: Vec<u64> = out.history.iter().map(|s| s.training_iteration).collect();
        assert_eq!(iters, vec![1, 2, 3, 4, 5], "each iteration once");
        assert_eq!(out.metrics.unwrap()["acc"], 15.0, "1 + 2 + 3 + 4 + 5, as without the failure");

        // With no restarts left the same failure ends the run.
        let flag = Arc::new(AtomicBool::new(false));
        let err = Trainer::function(move |ctx| {
            if ctx.world_rank() == 0 && !flag.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return Err("boom".into());
            }
            ctx.report([("x", 1.0)], None)?;
            Ok(())
        })
        .resources(NodeResources::declared(1.0))
        .storage(storage.path())
        .name("fatal")
        .fit()
        .unwrap_err();
        assert!(matches!(&err, TrainError::Failed { message, .. } if message.contains("boom")), "{err}");
    }
}
