//! `Tuner`: builds an experiment (from Rust or from a file), runs it, and
//! restores it after a crash.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use schedulers::{CombinedStopper, MetricThresholds, Scheduler, Stopper, TrialView};
use search::{BasicVariantGenerator, Domain, SearchConfig, Searcher, Space};
use trainer::{Backend, NodeResources, ProcessBackend, Request, ResourcePool, SlurmBackend, Storage, TrainLoop};

use crate::config::{Kind, ProgressMode, RunConfig, Stop, Trainable, TuneConfig};
use crate::experiment::{ExperimentFile, Resolved};
use crate::journal::Journaled;
use crate::result_grid::ResultGrid;
use crate::runner::view;
use crate::runner::{Clock, Durability, Finish, Parts, Reporter, Runner, Settings, WallClock};
use crate::simulate::{ArmSearcher, SimBackend};
use crate::store::Store;
use crate::TuneError;

/// Runs a hyperparameter sweep: Ray Tune's `Tuner`.
///
/// ```no_run
/// use search::{Domain, Mode, Space};
/// use tuner::{RunConfig, Stop, Trainable, TuneConfig, Tuner};
///
/// let space = Space::builder().param("x", Domain::uniform(-1.0, 1.0)).build()?;
/// let trainable = Trainable::function(|ctx| {
///     let x: f64 = ctx.param("x")?;
///     for step in 1..=10 {
///         ctx.report([("loss", (x - 0.3).powi(2) / step as f64)], None)?;
///     }
///     Ok(())
/// });
/// let grid = Tuner::new(trainable, space)
///     .tune_config(TuneConfig { metric: Some("loss".into()), mode: Some(Mode::Min), num_samples: 8, ..Default::default() })
///     .run_config(RunConfig { name: "demo".into(), stop: Stop::new().iterations(5), ..Default::default() })
///     .fit()?;
/// println!("{:?}", grid.best_result(None, None, Default::default())?.config);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Tuner {
    trainable: Option<Trainable>,
    file: ExperimentFile,
    /// A space built in Rust (used as built); else the file's `[space]`.
    space: Option<Space>,
    /// Points set in Rust (as JSON); else the file's.
    points: Option<Vec<search::Config>>,
    custom_stop: Option<Box<dyn Stopper>>,
    progress: ProgressMode,
    restore_dir: Option<PathBuf>,
    origin: String,
    custom_searcher: Option<Box<dyn Searcher>>,
    custom_scheduler: Option<Box<dyn Scheduler>>,
    resources: Option<NodeResources>,
}

/// Adds `config`'s keys that `space` lacks as constants (into nested tables
/// where both have one); whether anything was added.
fn fill_constants(space: &mut toml::Table, config: &serde_json::Map<String, serde_json::Value>) -> bool {
    let mut added = false;
    for (k, v) in config {
        match (space.get_mut(k), v) {
            (None, v) => {
                space.insert(k.clone(), search::json_to_toml(v));
                added = true;
            }
            (Some(toml::Value::Table(t)), serde_json::Value::Object(inner))
                if !(t.len() == 1 && t.keys().all(|name| search::DOMAIN_KINDS.contains(&name.as_str()))) =>
            {
                added |= fill_constants(t, inner);
            }
            _ => {}
        }
    }
    added
}

impl std::fmt::Debug for Tuner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tuner").field("file", &self.file).finish_non_exhaustive()
    }
}

impl Tuner {
    /// A sweep of `trainable` over `space` with default configs.
    pub fn new(trainable: Trainable, space: Space) -> Self {
        let mut file = ExperimentFile { space: space.to_toml(), ..Default::default() };
        let mut space = space;
        if let Some(d) = &trainable.defaults {
            // A Trainer's settings are the sweep's until run_config says otherwise;
            // its config's keys the space does not set are constants of every trial.
            if let serde_json::Value::Object(config) = &d.config {
                if fill_constants(&mut file.space, config) {
                    if let Ok(filled) = Space::from_toml(&file.space) {
                        space = filled;
                    }
                }
            }
            if let Some(name) = &d.name {
                file.experiment.name = name.clone();
            }
            file.experiment.storage = Some(d.storage.display().to_string());
            file.failure = d.failure.clone();
        }
        Self {
            trainable: Some(trainable),
            file,
            space: Some(space),
            points: None,
            custom_stop: None,
            progress: ProgressMode::Auto,
            restore_dir: None,
            origin: "experiment".into(),
            custom_searcher: None,
            custom_scheduler: None,
            resources: None,
        }
    }

    /// A sweep from an experiment file ([`ExperimentFile::read`]; `origin`
    /// names it in errors); its `[trainer]` says what runs, unless
    /// `trainable` is given. [`Tuner::fit`] checks it, once, before anything
    /// is written.
    pub fn from_file(file: ExperimentFile, origin: impl Into<String>, trainable: Option<Trainable>) -> Self {
        Self {
            trainable,
            file,
            space: None,
            points: None,
            custom_stop: None,
            progress: ProgressMode::Auto,
            restore_dir: None,
            origin: origin.into(),
            custom_searcher: None,
            custom_scheduler: None,
            resources: None,
        }
    }

    /// Sets what to tune and how. Settings it leaves at `None` (TPE's and
    /// BOHB's) keep what the experiment had, from its file or an earlier call.
    pub fn tune_config(mut self, c: TuneConfig) -> Self {
        let e = &mut self.file.experiment;
        e.metric = c.metric;
        e.mode = c.mode;
        e.num_samples = c.num_samples;
        e.max_concurrent_trials = c.max_concurrent_trials;
        e.time_budget_s = c.time_budget_s;
        e.seed = c.seed;
        let mut search = SearchConfig {
            algorithm: c.search,
            points_to_evaluate: c
                .points_to_evaluate
                .iter()
                .filter_map(|p| match search::json_to_toml(p) {
                    toml::Value::Table(t) => Some(t),
                    _ => None,
                })
                .collect(),
            max_concurrent: c.max_concurrent_search,
            repeat: c.repeat,
            // TPE's and BOHB's settings left at None keep what the experiment had.
            ..std::mem::take(&mut self.file.search)
        };
        if let Some(t) = &c.tpe {
            search.set_tpe(t);
        }
        if let Some(b) = &c.bohb {
            search.set_bohb(b);
        }
        self.file.search = search;
        self.points = Some(c.points_to_evaluate);
        self.file.scheduler = c.scheduler;
        self
    }

    /// Sets where and how it runs.
    pub fn run_config(mut self, c: RunConfig) -> Self {
        let e = &mut self.file.experiment;
        e.name = c.name;
        match c.storage_url {
            Some(url) => {
                e.storage = Some(url);
                e.local_dir = Some(c.storage.display().to_string());
            }
            None => e.storage = Some(c.storage.display().to_string()),
        }
        e.fail_fast = c.fail_fast;
        e.trial_files = c.trial_files;
        self.file.checkpoint = c.checkpoint;
        self.file.failure = c.failure;
        let Stop { thresholds, custom } = c.stop;
        self.file.stop = thresholds;
        self.custom_stop = custom;
        self.progress = c.progress;
        self
    }

    /// Uses a searcher of your own instead of the configured algorithm. It
    /// decides the number of trials through [`Searcher::total_trials`]
    /// (default: `num_samples`). To resume such a sweep, pass the same kind
    /// of searcher to the restored tuner; its saved state is restored into it.
    pub fn with_searcher(mut self, searcher: Box<dyn Searcher>) -> Self {
        self.custom_searcher = Some(searcher);
        self
    }

    /// Uses a scheduler of your own instead of the configured one (same resume
    /// rule as [`Tuner::with_searcher`]).
    pub fn with_scheduler(mut self, scheduler: Box<dyn Scheduler>) -> Self {
        self.custom_scheduler = Some(scheduler);
        self
    }

    /// Declares the node's resources (overriding detection, and the file's
    /// `[resources]`): how many trials fit at once, and which GPUs they get.
    pub fn resources(mut self, node: NodeResources) -> Self {
        self.resources = Some(node);
        self
    }

    /// Sets the progress display.
    pub fn progress(mut self, mode: ProgressMode) -> Self {
        self.progress = mode;
        self
    }

    /// The experiment directory this sweep writes to.
    pub fn experiment_dir(&self) -> PathBuf {
        if let Some(d) = &self.restore_dir {
            return d.clone();
        }
        Path::new(&self.file.experiment.local_root()).join(&self.file.experiment.name)
    }

    /// Reopens an experiment after a crash or Ctrl-C: finished trials are
    /// kept, unfinished ones restart from their latest checkpoint, and the
    /// searcher continues its sequence. `trainable` is needed when the
    /// experiment ran a Rust function (its file has no `[trainer]`).
    pub fn restore(experiment_dir: impl AsRef<Path>, trainable: Option<Trainable>) -> Result<Self, TuneError> {
        let dir = experiment_dir.as_ref().to_path_buf();
        let store = Store::open_existing(&dir.join("store"))?;
        let text = store.experiment()?.ok_or_else(|| TuneError::Corrupt(dir.clone(), "the store holds no experiment".into()))?;
        drop(store);
        let origin = format!("{}/experiment.toml", dir.display());
        let file = ExperimentFile::from_toml(&text, &origin, &[])?;
        let mut t = Tuner::from_file(file, origin, trainable);
        t.restore_dir = Some(dir);
        Ok(t)
    }

    /// Runs the sweep to the end and returns its results. Blocks; builds its
    /// own tokio runtime (use [`Tuner::fit_async`] inside one).
    pub fn fit(self) -> Result<ResultGrid, TuneError> {
        let rt = trainer::driver_runtime().map_err(|source| TuneError::Io { path: PathBuf::from("<runtime>"), source })?;
        rt.block_on(self.fit_async())
    }

    /// Runs the sweep inside an existing tokio runtime.
    pub async fn fit_async(mut self) -> Result<ResultGrid, TuneError> {
        let resuming = self.restore_dir.is_some();
        if self.file.experiment.seed.is_none() {
            self.file.experiment.seed = Some(random_seed());
        }
        // Check everything before anything is written: settings made in Rust
        // get the checks a file gets, and the sweep runs what was checked
        // (a Rust space as it was built, not read back from its TOML).
        let Resolved { file, space: checked_space, points, scheduler: configured, .. } =
            self.file.clone().resolve_with(&self.origin, self.space.take())?;
        let points = self.points.take().unwrap_or(points);
        let file = &file;
        let seed = file.experiment.seed.unwrap_or(0);
        let trainable = match (self.trainable.take(), &file.trainer) {
            (Some(t), _) => t,
            (None, Some(t)) => {
                let config = t.process_config().map_err(|e| {
                    TuneError::Experiment(crate::ExperimentError::Invalid {
                        file: self.origin.clone(),
                        key: format!("trainer.{}", e.key),
                        message: e.message,
                    })
                })?;
                Trainable::process(config).scaling(t.scaling())
            }
            (None, None) => return Err(TuneError::NoTrainer),
        };
        // A curves file with no space of the experiment's own: the space is a choice of its configs.
        let arms = match &trainable.kind {
            Kind::Simulated(curves) if checked_space.is_empty() => curves.configs(),
            _ => None,
        };
        let space = match &arms {
            Some(configs) => Space::builder()
                .param(ArmSearcher::<BasicVariantGenerator>::PARAM, Domain::choice(0..configs.len() as u64))
                .build()
                .map_err(search::SearchError::from)?,
            None => checked_space,
        };
        let e = &file.experiment;
        let basic = file.search.searcher(space, e.metric.as_deref(), e.mode, seed, e.num_samples, points, &file.bohb_budget())?;
        let basic: Box<dyn Searcher> = match arms {
            Some(configs) => Box::new(ArmSearcher::new(basic, configs)),
            None => basic,
        };
        let mut searcher: Box<dyn Searcher> = match self.custom_searcher.take() {
            Some(custom) => custom,
            None => file.search.around(basic),
        };
        let scheduler: Box<dyn Scheduler> = self.custom_scheduler.take().unwrap_or(configured);
        trainable.scaling.validate()?;
        // Worker processes run on the Slurm allocation nestor is inside (unless [cluster] says local).
        let allocation =
            match &trainable.kind {
                Kind::Train(TrainLoop::Process(_)) => file.cluster.allocation().map_err(|e| TuneError::Cluster(e.to_string()))?,
                _ if file.cluster.backend == trainer::ClusterBackend::Slurm => return Err(TuneError::Cluster(
                    "cluster.backend = \"slurm\" runs worker processes: give a [trainer] command (in-process trials run on this machine)"
                        .into(),
                )),
                _ => None,
            };
        let node = match (self.resources.take(), file.resources.is_empty(), &trainable.kind) {
            (Some(node), _, _) => node,
            // A simulation's slots are virtual: max_concurrent_trials of them.
            (None, _, Kind::Simulated(_)) => {
                let slots = file.experiment.max_concurrent_trials.unwrap_or(4) as f64;
                NodeResources::from_declared(&[("CPU".to_string(), slots)].into_iter().collect())?
            }
            (None, false, _) => NodeResources::from_declared(&file.resources)?,
            // The allocation's nodes stand instead (read below): this machine is not probed.
            (None, true, _) if allocation.is_some() => NodeResources::declared(0.0),
            (None, true, _) => NodeResources::detect(),
        };
        let mut unshared = Vec::new();
        if let Some(a) = &allocation {
            file.cluster
                .check_reachable(file.trainer.as_ref().and_then(|t| t.report_bind), &a.job_id)
                .map_err(|e| TuneError::Cluster(e.0))?;
            // Ranks read and write checkpoints below the experiment's directory where every node sees it;
            // else they ship them through the driver, to an object store.
            let root = std::path::absolute(file.experiment.local_root())
                .map_err(|source| TuneError::Io { path: PathBuf::from(file.experiment.local_root()), source })?;
            std::fs::create_dir_all(&root).map_err(|source| TuneError::Io { path: root.clone(), source })?;
            if resuming {
                // Steps an earlier driver of this experiment left in this job go first: they hold the nodes.
                trainer::cancel_leftover_steps(&a.job_id, &root.join(&file.experiment.name)).await;
            }
            unshared = a.unshared_nodes(&root).map_err(|e| TuneError::Cluster(e.0))?;
            if !unshared.is_empty() && file.experiment.storage_url().is_none() {
                return Err(TuneError::Cluster(format!(
                    "{} is not visible on {} (a file written here was not there), and checkpoints go below it: a trial \
                     that runs there could neither save nor resume from them. Put the experiment on a file system all \
                     nodes share (local_dir, or --storage), or send checkpoints to an object store \
                     (experiment.storage = \"s3://bucket/prefix\"; ranks then ship their shards through the driver)",
                    root.display(),
                    unshared.join(", ")
                )));
            }
        }
        let (mut node_description, mut node_gpus) = (node.describe(), node.gpu_note.clone());
        let pool = match &allocation {
            Some(a) => {
                // Declared [resources] stand for each node.
                let nodes: Vec<(String, NodeResources)> = a
                    .node_resources()
                    .into_iter()
                    .map(|(name, detected)| (name, if file.resources.is_empty() { detected } else { node.clone() }))
                    .collect();
                node_description = format!(
                    "Slurm job {}, {} node(s): {}",
                    a.job_id,
                    nodes.len(),
                    nodes.iter().map(|(n, r)| format!("{n} {}", r.describe())).collect::<Vec<_>>().join(", ")
                );
                node_gpus = nodes.first().map(|(_, r)| r.gpu_note.clone()).unwrap_or_default();
                ResourcePool::cluster(nodes)
            }
            None => ResourcePool::new(node),
        };
        let request = Request::from_scaling(&trainable.scaling);
        // A trial that can never fit is refused now, not left pending.
        pool.check(&request)?;
        // Absolute, so workers with another working directory find their trial directory.
        let exp_dir = std::path::absolute(self.experiment_dir()).map_err(|source| TuneError::Io { path: self.experiment_dir(), source })?;
        let store_dir = exp_dir.join("store");
        // Checkpoints: an object store must answer before anything is written.
        let storage = match file.experiment.storage_url() {
            Some(url) => {
                let root = Storage::parse(url).map_err(TuneError::Storage)?.join(&file.experiment.name);
                root.probe().await.map_err(TuneError::Storage)?;
                root
            }
            None => Storage::local(&exp_dir),
        };
        let mut pending = VecDeque::new();
        let mut paused = Vec::new();
        let mut next_index = 0;
        let mut finished = (0, 0);
        // A replay of recorded curves writes the scheduler's state at its end only.
        let journal = !matches!(trainable.kind, Kind::Simulated(_));
        let (store, scheduler) = if resuming {
            let store = Store::open_existing(&store_dir)?;
            store.recover_created()?;
            if let Some(state) = store.searcher()? {
                searcher.restore(&state)?;
            }
            // The scheduler's latest snapshot, and the calls made after it.
            let mut scheduler = Journaled::resume(scheduler, &store, journal)?;
            let trials = store.trials()?;
            // Trials created after the journal ends (the driver died before the
            // flush that would have written their `on_trial_add`), in creation order.
            if let Some(added) = scheduler.added() {
                for t in trials.iter().filter(|t| t.index >= added) {
                    let created = TrialView { status: schedulers::TrialStatus::Pending, num_results: 0, ..view(t) };
                    scheduler.on_trial_add(&created)?;
                }
            }
            // Trials that ended after the journal ends: ended for the scheduler too (below).
            let mut ended = Vec::new();
            for mut t in trials {
                if !t.status.is_finished() {
                    store.refresh_trial(&mut t)?;
                } else if scheduler.is_live(&t.id) {
                    ended.push(t.clone());
                }
                next_index = next_index.max(t.index + 1);
                match t.status {
                    schedulers::TrialStatus::Terminated => finished.0 += 1,
                    schedulers::TrialStatus::Error => finished.1 += 1,
                    schedulers::TrialStatus::Paused => paused.push(t),
                    _ => pending.push_back(t),
                }
            }
            let mut lists = TrialLists { pending: &mut pending, paused: &mut paused, finished: &mut finished };
            replay_unseen(&store, &mut scheduler, &mut *searcher, &mut lists)?;
            for t in &ended {
                if t.status == schedulers::TrialStatus::Error {
                    scheduler.on_trial_error(&view(t))?;
                } else {
                    scheduler.on_trial_complete(&view(t), t.last_result.as_ref())?;
                }
            }
            (store, scheduler)
        } else {
            if store_dir.exists() {
                return Err(TuneError::Exists(exp_dir));
            }
            std::fs::create_dir_all(&exp_dir).map_err(|source| TuneError::Io { path: exp_dir.clone(), source })?;
            let text = file.to_toml_string();
            std::fs::write(exp_dir.join("experiment.toml"), &text)
                .map_err(|source| TuneError::Io { path: exp_dir.join("experiment.toml"), source })?;
            let store = Store::open(&store_dir)?;
            store.put_experiment(&text)?;
            store.put_searcher(&searcher.save())?;
            store.flush()?;
            if !storage.is_local() {
                // Beside the checkpoints, for tools that only see the bucket.
                storage.put_bytes("experiment.toml", text.into_bytes()).await.map_err(TuneError::Storage)?;
            }
            let scheduler = Journaled::new(scheduler, &store, journal);
            (store, scheduler)
        };
        if resuming {
            // Checkpoints a crash left uncommitted (half uploaded, or beyond
            // num_to_keep but not yet deleted) go before any trial runs again.
            collect_garbage(&store, &storage).await?;
        }
        let mut report_note = None;
        // A replay of recorded curves is a backend that is also the loop's (virtual) clock.
        let (backend, clock): (Arc<dyn Backend>, Arc<dyn Clock>) = match trainable.kind {
            Kind::Simulated(curves) => {
                let sim = Arc::new(SimBackend::new(curves));
                (sim.clone(), sim)
            }
            Kind::Train(TrainLoop::Function(f)) => (Arc::new(f), Arc::new(WallClock::new())),
            Kind::Train(TrainLoop::Process(mut c)) => {
                c.use_gpu = trainable.scaling.use_gpu;
                let server_err = |source| TuneError::Io { path: PathBuf::from("<report server>"), source };
                match allocation {
                    Some(a) => {
                        // Other nodes must reach the report server: every interface, unless [trainer] report_bind says.
                        if file.trainer.as_ref().and_then(|t| t.report_bind).is_none() {
                            c.report_bind = std::net::SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0));
                        }
                        let advertise = file.cluster.report_address.clone().unwrap_or_else(host_name);
                        let backend = SlurmBackend::start(c, a, Some(&advertise))
                            .await
                            .map_err(server_err)?
                            .shipping(!unshared.is_empty())
                            .experiment(&exp_dir);
                        // Steps an earlier driver of this experiment left running in this job go first.
                        backend.cancel_leftovers(&exp_dir).await;
                        let mut note = format!("nestor: workers report to {}", backend.report_url());
                        if !unshared.is_empty() {
                            note.push_str(&format!(
                                "\nnestor: {} is not shared with {}: ranks ship checkpoints through the driver to {}",
                                exp_dir.display(),
                                unshared.join(", "),
                                storage.uri("")
                            ));
                        }
                        report_note = Some(note);
                        (Arc::new(backend), Arc::new(WallClock::new()))
                    }
                    None => (Arc::new(ProcessBackend::start(c).await.map_err(server_err)?), Arc::new(WallClock::new())),
                }
            }
        };
        let mut stoppers: Vec<Box<dyn Stopper>> = vec![Box::new(MetricThresholds(file.stop.clone()))];
        stoppers.extend(self.custom_stop.take());
        // Trials run as the node's resources allow, capped by max_concurrent_trials.
        let fit = {
            let mut probe = pool.clone();
            std::iter::from_fn(|| probe.try_allocate(&request)).take(100_000).count().max(1)
        };
        let max_concurrent = file.experiment.max_concurrent_trials.unwrap_or(usize::MAX).min(fit);
        let mut progress = crate::progress::Progress::new(self.progress, file.experiment.metric.clone());
        let planned = searcher.total_trials().unwrap_or(file.experiment.num_samples);
        let on = if pool.is_cluster() { "" } else { "node " };
        progress.note(&format!("nestor: {on}{node_description}, {node_gpus}"));
        if let Some(note) = report_note {
            progress.note(&note);
        }
        progress.note(&format!(
            "nestor: {} {} ({} trials, {} at a time)",
            if resuming { "resuming" } else { "experiment" },
            exp_dir.display(),
            planned,
            max_concurrent
        ));
        // A replay's results can be computed again: durable at its end only, and no files for people.
        let durability = if clock.is_virtual() { Durability::AtEnd } else { Durability::EveryBatch };
        let metric = file.experiment.metric.clone();
        let files = file.experiment.trial_files && durability == Durability::EveryBatch;
        let reporter = Reporter::new(exp_dir.clone(), metric.clone(), progress, files, finished);
        let settings = Settings {
            exp_dir: exp_dir.clone(),
            metric,
            max_concurrent,
            max_trials: searcher.total_trials().unwrap_or(file.experiment.num_samples),
            time_budget: file.experiment.time_budget_s.map(Duration::from_secs_f64),
            fail_fast: file.experiment.fail_fast,
            request,
            checkpoint: file.checkpoint.clone(),
            failure: file.failure.clone(),
            stop_thresholds: MetricThresholds(file.stop.clone()),
            durability,
        };
        let (runner, inputs) = Runner::new(Parts {
            settings,
            store: store.clone(),
            backend,
            clock,
            searcher,
            scheduler,
            stopper: Box::new(CombinedStopper(stoppers)),
            pool,
            storage,
            pending,
            paused,
            next_index,
            reporter,
        });
        match runner.run(inputs).await? {
            Finish::Interrupted => Err(TuneError::Interrupted(exp_dir)),
            Finish::Done => Ok(ResultGrid::from_store(&exp_dir, &store)?),
        }
    }
}

/// The trials of a resumed sweep, by what happens to them next.
struct TrialLists<'a> {
    pending: &'a mut VecDeque<crate::store::TrialRecord>,
    paused: &'a mut Vec<crate::store::TrialRecord>,
    finished: &'a mut (u64, u64),
}

/// What the resume hands the scheduler, or carries out for it, in the
/// order the sweep met them.
enum Catch {
    /// A stored result its journal does not hold.
    Unseen(search::TrialResult),
    /// A decision it made (and journaled) on a trial whose run never exited.
    Decided(schedulers::Decision),
}

/// Squares the scheduler with what the store holds beyond its journal, in
/// the order it was stored:
/// - results stored after what its journal holds (the driver died between
///   a result's flush and the journal's) are fed to it, and its decisions
///   applied (a PAUSED trial with such results is decided on again, as if
///   running);
/// - decisions it made whose runs never exited (the driver died in
///   between) are carried out.
///
/// Either way as the sweep would have: a trial it stops ends TERMINATED,
/// one it pauses is PAUSED, an exploit or a resize is carried out before
/// the trial runs again.
fn replay_unseen(
    store: &Store,
    scheduler: &mut Journaled,
    searcher: &mut dyn Searcher,
    lists: &mut TrialLists<'_>,
) -> Result<(), TuneError> {
    use schedulers::{Decision, TrialStatus};
    let at = |r: &search::TrialResult| r.metrics.get("timestamp").copied().unwrap_or(0.0);
    let mut catches = Vec::new();
    for t in lists.pending.iter().chain(lists.paused.iter()) {
        let from = scheduler.seen(&t.id);
        for r in store.results(&t.id)?.into_iter().filter(|r| r.seq >= from) {
            catches.push((at(&r), t.id.clone(), r.seq, Catch::Unseen(r)));
        }
    }
    let deciding: std::collections::HashSet<String> = catches.iter().map(|c| c.1.clone()).collect();
    for t in lists.pending.iter_mut() {
        match t.decided.take() {
            // Decided on a result the journal does not hold: decided again below.
            Some(_) if deciding.contains(&t.id) => store.put_trial(t)?,
            Some(d) => {
                let when = t.last_result.as_ref().map_or(0.0, at);
                catches.push((when, t.id.clone(), t.num_results, Catch::Decided(d)));
            }
            None => {}
        }
    }
    let (again, still): (Vec<_>, Vec<_>) = std::mem::take(lists.paused).into_iter().partition(|t| deciding.contains(&t.id));
    *lists.paused = still;
    lists.pending.extend(again);
    catches.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    for (_, id, _, catch) in catches {
        let Some(i) = lists.pending.iter().position(|t| t.id == id) else { continue };
        let (decision, result) = match catch {
            Catch::Unseen(r) => {
                tracing::info!(trial = %r.trial_id, iteration = r.training_iteration, "replaying a result the scheduler had not seen");
                let decision = scheduler.on_trial_result(&view(&lists.pending[i]), &r)?;
                searcher.on_trial_result(&r.trial_id, &r);
                (decision, Some(r))
            }
            Catch::Decided(d) => {
                tracing::info!(trial = %id, "carrying out a decision its run did not live to see: {d:?}");
                let last = lists.pending[i].last_result.clone();
                (d, last)
            }
        };
        match decision {
            Decision::Continue => continue,
            Decision::Exploit(e) => {
                // Carried out before the trial runs again.
                lists.pending[i].pending_exploit = Some(*e);
                store.put_trial(&lists.pending[i])?;
                continue;
            }
            Decision::Resize { num_workers } => {
                // It restarts anyway: with the new size, when its latest checkpoint is the one decided on and fits.
                let t = &mut lists.pending[i];
                let fits = t
                    .latest_checkpoint
                    .as_ref()
                    .filter(|c| result.as_ref().is_some_and(|r| Some(&c.uri) == r.checkpoint.as_ref()))
                    .is_some_and(|c| c.required_world_size().is_none_or(|n| n == num_workers));
                if fits {
                    t.num_workers = Some(num_workers);
                    t.resizing = true;
                    t.resizes += 1;
                }
                store.put_trial(t)?;
                continue;
            }
            Decision::Pause | Decision::Stop => {}
        }
        let Some(mut t) = lists.pending.remove(i) else { continue };
        if decision == Decision::Pause {
            t.status = TrialStatus::Paused;
            store.put_trial(&t)?;
            searcher.on_trial_pause(&t.id);
            let at = lists.paused.partition_point(|p| p.index < t.index);
            lists.paused.insert(at, t);
        } else {
            t.status = TrialStatus::Terminated;
            t.ended_at = Some(crate::clock::now_unix());
            store.put_trial(&t)?;
            scheduler.on_trial_complete(&view(&t), t.last_result.as_ref())?;
            searcher.on_trial_complete(&t.id, t.last_result.as_ref(), false);
            lists.finished.0 += 1;
        }
    }
    scheduler.release();
    store.flush()?;
    Ok(())
}

/// Deletes every checkpoint in storage that the store does not hold as
/// committed. Checkpoints are matched by name within their trial, so an
/// experiment directory that moved keeps its checkpoints.
async fn collect_garbage(store: &Store, storage: &Storage) -> Result<(), TuneError> {
    use futures_util::{StreamExt, TryStreamExt};
    let committed = store.all_checkpoints()?;
    let trials = store.trials()?;
    // One listing per trial, several at once: an object store answers each in milliseconds.
    let sweeps = trials.iter().map(|t| {
        let trial = storage.join(&format!("trials/{}", t.id));
        let keep: std::collections::HashSet<String> =
            committed.get(&t.id).into_iter().flatten().map(|c| crate::runner::checkpoint_name(&c.uri).to_string()).collect();
        async move { crate::runner::remove_uncommitted(&trial, &keep).await.map_err(TuneError::Storage) }
    });
    futures_util::stream::iter(sweeps).buffer_unordered(16).try_collect::<Vec<()>>().await?;
    Ok(())
}

/// This machine's host name (what other nodes know it by).
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok && end > 0 {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "localhost".into()
    }
}

fn random_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    // splitmix64 of time and pid: a seed, not a secret.
    let mut z = (t as u64) ^ (u64::from(std::process::id()) << 32);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) >> 11
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use schedulers::{Decision, Exploit, Fifo, TrialStatus};
    use search::TrialResult;

    use super::*;
    use crate::store::TrialRecord;

    /// A run that got its decision and died with the driver before it
    /// exited: its record says what was decided; the resume carries it out
    /// without asking the scheduler again (its journal holds the call).
    #[test]
    fn a_decision_whose_run_never_exited_is_carried_out_on_resume() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let mut scheduler = Journaled::new(Box::new(Fifo), &store, true);
        let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
        let mut searcher = BasicVariantGenerator::new(space, 4, 0);
        let exploit = Exploit {
            trial_id: "t2".into(),
            donor: "t0".into(),
            checkpoint: "c".into(),
            checkpoint_iteration: 1,
            config: serde_json::json!({ "x": 0.5 }),
        };
        let decided = [Some(Decision::Pause), Some(Decision::Stop), Some(Decision::Exploit(Box::new(exploit.clone()))), None];
        let mut pending = VecDeque::new();
        for (i, d) in decided.into_iter().enumerate() {
            let mut t = TrialRecord::new(format!("t{i}"), i as u64, serde_json::json!({ "x": 0.1 }), 0.0);
            scheduler.on_trial_add(&view(&t)).unwrap();
            t.status = TrialStatus::Running;
            let r = TrialResult {
                extra: None,
                trial_id: t.id.clone(),
                seq: 0,
                training_iteration: 1,
                metrics: [("loss".to_string(), 1.0), ("timestamp".to_string(), i as f64)].into_iter().collect(),
                checkpoint: None,
            };
            store.put_result(&r).unwrap();
            assert_eq!(scheduler.on_trial_result(&view(&t), &r).unwrap(), Decision::Continue);
            t.num_results = 1;
            t.last_result = Some(r);
            t.decided = d;
            store.put_trial(&t).unwrap();
            // Resumed, a trial that was running is pending.
            t.status = TrialStatus::Pending;
            pending.push_back(t);
        }
        let (mut paused, mut finished) = (Vec::new(), (0, 0));
        let mut lists = TrialLists { pending: &mut pending, paused: &mut paused, finished: &mut finished };
        replay_unseen(&store, &mut scheduler, &mut searcher, &mut lists).unwrap();
        assert_eq!(paused.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["t0"]);
        assert_eq!(store.trial("t0").unwrap().unwrap().status, TrialStatus::Paused);
        assert_eq!(finished, (1, 0));
        assert_eq!(store.trial("t1").unwrap().unwrap().status, TrialStatus::Terminated);
        assert!(!scheduler.is_live("t1"), "the scheduler is told it completed");
        assert_eq!(pending.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["t2", "t3"]);
        assert_eq!(pending[0].pending_exploit, Some(exploit), "carried out before it runs again");
        assert_eq!(store.trial("t2").unwrap().unwrap().decided, None);
        assert!(pending.iter().all(|t| t.decided.is_none()));
        assert!(["t0", "t2", "t3"].iter().all(|t| scheduler.seen(t) == 1), "no result fed twice");
    }
}
