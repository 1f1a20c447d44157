//! `Tuner`: builds an experiment (from Rust or from a file), runs it, and
//! restores it after a crash.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use schedulers::{CombinedStopper, MetricThresholds, Scheduler, Stopper};
use search::{BasicVariantGenerator, Domain, SearchConfig, Searcher, Space};
use trainer::{Backend, NodeResources, Request, Storage, TrainLoop};

use crate::callback::Callback;
use crate::config::{Kind, ProgressMode, RunConfig, Stop, Trainable, TuneConfig};
use crate::curves::{ArmSearcher, SimBackend};
use crate::experiment::{ExperimentFile, Resolved};
use crate::opening::{self, Errored, Opened};
use crate::placement::{Nodes, Startup};
use crate::result_grid::ResultGrid;
use crate::runner::{experiment_info, Clock, Durability, FilesForPeople, Finish, Parts, Reporter, Runner, Settings, WallClock};
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
    errored: Errored,
    origin: String,
    custom_searcher: Option<Box<dyn Searcher>>,
    custom_scheduler: Option<Box<dyn Scheduler>>,
    resources: Option<NodeResources>,
    callbacks: Vec<Box<dyn Callback>>,
    callback_deadline: Duration,
    /// `keep_best`: how many finished trials, and the fold for the others.
    keep: Option<(usize, crate::runner::keep::Fold)>,
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
            errored: Errored::Keep,
            origin: "experiment".into(),
            custom_searcher: None,
            custom_scheduler: None,
            resources: None,
            callbacks: Vec::new(),
            callback_deadline: crate::callback::DEFAULT_DEADLINE,
            keep: None,
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
            errored: Errored::Keep,
            origin: origin.into(),
            custom_searcher: None,
            custom_scheduler: None,
            resources: None,
            callbacks: Vec::new(),
            callback_deadline: crate::callback::DEFAULT_DEADLINE,
            keep: None,
        }
    }

    /// The configs to try first (in the search space's terms), in order,
    /// as they are: not checked against the space.
    pub(crate) fn points(mut self, points: Vec<search::Config>) -> Self {
        self.points = Some(points);
        self
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
        e.log_to_driver = c.log_to_driver;
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

    /// Adds a data set (the file's `[datasets]`): planned once before any
    /// trial runs, each rank reads its share with
    /// [`Context::dataset_shard`](trainer::Context::dataset_shard).
    pub fn dataset(mut self, name: impl Into<String>, spec: trainer::data::DatasetSpec) -> Self {
        self.file.datasets.insert(name.into(), spec);
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

    /// Adds a consumer of the sweep's events ([`Event`]): it runs on a
    /// thread of its own and sees every event in order. One that fails is
    /// logged; one that panics, or is busy with one event for longer than
    /// the deadline ([`Tuner::callback_deadline`]), is cut off. The sweep
    /// never waits for it beyond that, at its end either.
    ///
    /// [`Event`]: crate::callback::Event
    pub fn callback(mut self, callback: impl Callback + 'static) -> Self {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// A simulation at scale: keeps the best `n` finished trials (by their
    /// last value of the experiment's metric; at least 1) in the store and
    /// hands each of the others to `fold`, in the order they are let go
    /// of, once it ended; then deletes it. The store, and the memory it
    /// takes, stay the size of `n` trials (plus those that may still run)
    /// however many the sweep runs. For simulated trainables only; such a
    /// sweep cannot be resumed.
    pub fn keep_best(mut self, n: usize, fold: impl FnMut(crate::store::TrialRecord) + Send + 'static) -> Self {
        self.keep = Some((n, Box::new(fold)));
        self
    }

    /// How long a callback may take over one event, or over closing at the
    /// sweep's end, before it is cut off (30 s by default).
    pub fn callback_deadline(mut self, deadline: Duration) -> Self {
        self.callback_deadline = deadline;
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
        Self::restore_with(experiment_dir, trainable, &[])
    }

    /// [`Tuner::restore`], with `trainer.` keys of the stored experiment
    /// overridden (`trainer.working_dir=...`): what differs on the machine it
    /// goes on from (a command's paths, its working directory). Other keys
    /// are refused: the sweep goes on as it started.
    pub fn restore_with(experiment_dir: impl AsRef<Path>, trainable: Option<Trainable>, sets: &[String]) -> Result<Self, TuneError> {
        let dir = experiment_dir.as_ref().to_path_buf();
        let origin = format!("{}/experiment.toml", dir.display());
        if let Some(bad) = sets.iter().find(|s| !s.trim_start().starts_with("trainer.")) {
            return Err(TuneError::Experiment(crate::ExperimentError::Set {
                arg: bad.clone(),
                message: "a resumed sweep takes overrides of trainer. keys only (what differs on this machine)".into(),
            }));
        }
        let store = Store::open_existing(&dir.join("store"))?;
        let text = store.experiment()?.ok_or_else(|| TuneError::Corrupt(dir.clone(), "the store holds no experiment".into()))?;
        drop(store);
        let file = ExperimentFile::from_toml(&text, &origin, sets)?;
        let mut t = Tuner::from_file(file, origin, trainable);
        t.restore_dir = Some(dir);
        Ok(t)
    }

    /// What a restored sweep does with its trials in ERROR (Ray's
    /// `resume_errored` and `restart_errored`): keep them (the default),
    /// run them on from their latest checkpoint, or run them again from
    /// the start (their results and checkpoints deleted).
    pub fn errored(mut self, errored: Errored) -> Self {
        self.errored = errored;
        self
    }

    /// Runs the sweep to the end and returns its results. Blocks; builds its
    /// own tokio runtime (use [`Tuner::fit_async`] inside one).
    pub fn fit(self) -> Result<ResultGrid, TuneError> {
        let rt = trainer::driver_runtime().map_err(|source| TuneError::Io { path: PathBuf::from("<runtime>"), source })?;
        rt.block_on(self.fit_async())
    }

    /// Runs the sweep inside an existing tokio runtime.
    pub async fn fit_async(self) -> Result<ResultGrid, TuneError> {
        let (exp_dir, store) = self.sweep().await?;
        Ok(ResultGrid::from_store(&exp_dir, &store)?)
    }

    /// Runs the sweep to the end without loading its results: memory stays
    /// what the sweep needs, however many trials it ran (a `ResultGrid`
    /// holds every result). Returns the experiment's store, still open, to
    /// read a trial at a time ([`Store::each_trial`]); the experiment
    /// directory is its parent. Drop it before [`ResultGrid::load`] opens
    /// the directory again.
    pub fn run(self) -> Result<Store, TuneError> {
        let rt = trainer::driver_runtime().map_err(|source| TuneError::Io { path: PathBuf::from("<runtime>"), source })?;
        rt.block_on(async { self.sweep().await.map(|(_, store)| store) })
    }

    /// The sweep: its experiment directory and store once it is over.
    async fn sweep(mut self) -> Result<(PathBuf, Store), TuneError> {
        let resuming = self.restore_dir.is_some();
        if self.file.experiment.seed.is_none() {
            self.file.experiment.seed = Some(random_seed());
        }
        // Python code the sweep calls is served by the driver that runs it.
        let hooks = self.file.python.clone();
        let channel = if hooks.is_empty() {
            None
        } else {
            let channel = crate::hooks::Channel::from_env().map_err(TuneError::Hooks)?;
            let channel = channel.ok_or_else(|| {
                TuneError::Hooks(format!(
                    "this sweep calls Python code ({}); run or resume it from its script (Tuner(...).fit(), \
                     Tuner.restore(path, trainable).fit()), which serves it, not with the nestor command",
                    hooks.describe()
                ))
            })?;
            if hooks.explore && !crate::hooks::give_explore(&mut self.file.scheduler, &channel) {
                return Err(TuneError::Hooks("explore = true needs a pbt scheduler".into()));
            }
            if let Some(s) = hooks.callback_deadline_s.filter(|s| s.is_finite() && *s > 0.0) {
                self.callback_deadline = Duration::from_secs_f64(s);
            }
            Some(channel)
        };
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
        let mut searcher: Box<dyn Searcher> = match (self.custom_searcher.take(), &channel) {
            (Some(custom), _) => custom,
            (None, Some(channel)) if hooks.search => file.search.around(Box::new(crate::hooks::PythonSearcher::new(Arc::clone(channel)))),
            (None, _) => file.search.around(basic),
        };
        if let (true, Some(channel)) = (hooks.sample, &channel) {
            searcher = Box::new(crate::hooks::PythonSampled::new(searcher, Arc::clone(channel), seed));
        }
        let scheduler: Box<dyn Scheduler> = self.custom_scheduler.take().unwrap_or(configured);
        trainable.scaling.validate()?;
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
        // Where the trials run, checked before anything is written.
        if let Some(bind) = file.trainer.as_ref().and_then(|t| t.report_bind) {
            std::net::TcpListener::bind(bind).map_err(|e| {
                TuneError::Experiment(crate::ExperimentError::Invalid {
                    file: self.origin.clone(),
                    key: "trainer.report_bind".into(),
                    message: format!("cannot listen on {bind}: {e}"),
                })
            })?;
        }
        let request = Request::from_scaling(&trainable.scaling);
        let startup = Startup { file, exp_dir: &exp_dir, storage: &storage, resuming, request: &request };
        let slurm_jobs = file.cluster.backend == trainer::ClusterBackend::SlurmJobs;
        let mut placement = crate::placement::find(file, &trainable.kind, self.resources.take())?;
        placement.check(&startup).await?;
        let Nodes { pool, description, notes: node_notes } = placement.nodes();
        // A trial that can never fit is refused now, not left pending.
        pool.check(&request)?;
        // A replay of recorded curves writes the scheduler's state at its end only.
        let journal = !matches!(trainable.kind, Kind::Simulated(_));
        let keep = match self.keep.take() {
            None => None,
            Some((n, fold)) => {
                let invalid = |message: &str| {
                    TuneError::Experiment(crate::ExperimentError::Invalid {
                        file: self.origin.clone(),
                        key: "keep_best".into(),
                        message: message.into(),
                    })
                };
                if journal {
                    return Err(invalid("for simulations only: a real trial's files and checkpoints would outlive its record"));
                }
                let metric = file.experiment.metric.clone().ok_or_else(|| invalid("needs experiment.metric to rank the trials"))?;
                let mode = file.experiment.mode.unwrap_or(search::Mode::Min);
                Some(crate::runner::keep::Keep::new(n, metric, mode, fold))
            }
        };
        // Data sets: planned (and refused by file) before anything is written.
        let plans = if resuming || file.datasets.is_empty() { None } else { Some(plan_datasets(file, &self.origin, seed).await?) };
        let Opened { store, scheduler, pending, paused, next_index, finished } = if resuming {
            opening::resume(&store_dir, &storage, &mut *searcher, scheduler, journal, self.errored).await?
        } else {
            opening::create(&exp_dir, &storage, file, &*searcher, scheduler, journal).await?
        };
        let datasets = datasets_file(&exp_dir, file, plans)?;
        // A replay of recorded curves is a backend that is also the loop's (virtual) clock.
        let mut notes = Vec::new();
        // Ranks that are processes write logs, shown on the console as they come.
        let echo_ranks = file.experiment.log_to_driver && matches!(trainable.kind, Kind::Train(TrainLoop::Process(_)));
        let (backend, clock): (Arc<dyn Backend>, Arc<dyn Clock>) = match trainable.kind {
            Kind::Simulated(curves) => {
                let sim = Arc::new(SimBackend::new(curves));
                (sim.clone(), sim)
            }
            Kind::Train(TrainLoop::Function(f)) => (Arc::new(f), Arc::new(WallClock::new())),
            Kind::Train(TrainLoop::Process(mut c)) => {
                c.use_gpu = trainable.scaling.use_gpu;
                // Ranks on nodes that do not see the plan fetch it from the driver.
                c.files.extend(datasets.iter().cloned());
                let launcher = placement.backend(c, &startup).await?;
                notes = launcher.notes;
                (launcher.backend, Arc::new(WallClock::new()))
            }
        };
        let mut stoppers: Vec<Box<dyn Stopper>> = vec![Box::new(MetricThresholds(file.stop.clone()))];
        stoppers.extend(self.custom_stop.take());
        if let (true, Some(channel)) = (hooks.stop, &channel) {
            stoppers.push(Box::new(crate::hooks::PythonStopper::new(Arc::clone(channel))));
        }
        // Trials run as the node's resources allow, capped by max_concurrent_trials.
        let fit = {
            let mut probe = pool.clone();
            std::iter::from_fn(|| probe.try_allocate(&request)).take(100_000).count().max(1)
        };
        let max_concurrent = file.experiment.max_concurrent_trials.unwrap_or(usize::MAX).min(fit);
        let mut progress = crate::progress::Progress::new(self.progress, file.experiment.metric.clone());
        if echo_ranks {
            progress.echo_ranks(exp_dir.clone());
        }
        let planned = searcher.total_trials().unwrap_or(file.experiment.num_samples);
        progress.note(&format!("nestor: {description}"));
        for note in node_notes {
            progress.note(&note);
        }
        for note in notes {
            progress.note(&note);
        }
        progress.note(&format!(
            "nestor: {} {} ({}, {} at a time)",
            if resuming { "resuming" } else { "experiment" },
            exp_dir.display(),
            crate::text::trials(planned),
            max_concurrent
        ));
        // A replay's results can be computed again: durable at its end only, and no files for people.
        let durability = if clock.is_virtual() { Durability::AtEnd } else { Durability::EveryBatch };
        let metric = file.experiment.metric.clone();
        let files = (durability == Durability::EveryBatch).then_some(if file.experiment.trial_files {
            FilesForPeople::PerTrial
        } else {
            FilesForPeople::Experiment
        });
        let info = experiment_info(exp_dir.clone(), file, planned, resuming);
        let mut callbacks = Vec::new();
        for (i, c) in file.callbacks.iter().enumerate() {
            callbacks.push(c.build(&exp_dir, &file.experiment.name).map_err(|message| {
                TuneError::Experiment(crate::ExperimentError::Invalid {
                    file: self.origin.clone(),
                    key: format!("callbacks[{i}]"),
                    message,
                })
            })?);
        }
        callbacks.append(&mut self.callbacks);
        if let Some(channel) = channel.as_ref().filter(|_| !hooks.callbacks.is_empty()) {
            callbacks.extend(channel.callback(&hooks.callbacks));
        }
        let reporter = Reporter::new(info, progress, files, finished, callbacks, self.callback_deadline);
        let settings = Settings {
            exp_dir: exp_dir.clone(),
            rank_metrics: hooks.rank_metrics,
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
            workers_from: file.trainer.as_ref().and_then(|t| t.num_workers_from.clone()),
            datasets,
        };
        // An experiment in an object store: what a Python driver wrote for it goes up now, the files for
        // people when the sweep ends (its store is mirrored at every flush).
        let remote = (!storage.is_local()).then(|| storage.clone());
        if let Some(r) = &remote {
            if let Err(e) = crate::remote::push(&exp_dir, r, "driver").await {
                tracing::warn!("copying the driver's files to {}: {e}", r.uri("driver"));
            }
        }
        let (runner, inputs) = Runner::new(Parts {
            settings,
            store: store.clone(),
            keep,
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
        let finish = runner.run(inputs).await;
        if slurm_jobs {
            // Whatever way the sweep ends, no job of its own stays in the queue (one Slurm requeued
            // as its run ended would start later and run the trial again on someone's nodes).
            match trainer::cancel_leftover_jobs(&exp_dir).await {
                Ok(left) if !left.is_empty() => {
                    let ids: Vec<String> = left.iter().map(|r| format!("{} ({}, {:?})", r.id, r.name, r.state)).collect();
                    eprintln!("nestor: cancelled {} job(s) of this sweep still in Slurm's queue: {}", left.len(), ids.join(", "));
                }
                Ok(_) => {}
                Err(e) => eprintln!("nestor: could not check Slurm's queue for jobs of this sweep: {}", e.0),
            }
        }
        if let Some(r) = &remote {
            match crate::remote::push(&exp_dir, r, "").await {
                Ok(n) => tracing::debug!("copied {n} files to {}", r.uri("")),
                Err(e) => eprintln!("nestor: could not copy the experiment's files to {}: {e}", r.uri("")),
            }
        }
        match finish? {
            Finish::Interrupted => Err(TuneError::Interrupted(exp_dir)),
            Finish::Done => Ok((exp_dir, store)),
        }
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

/// Plans the experiment's `[datasets]`: a refusal names the data set and its file.
#[cfg(feature = "data")]
async fn plan_datasets(file: &ExperimentFile, origin: &str, seed: u64) -> Result<trainer::data::DataPlans, TuneError> {
    trainer::data::plan_all(&file.datasets, seed).await.map_err(|e| match e {
        trainer::data::DataError::Refused { name, message } => {
            TuneError::Experiment(crate::ExperimentError::Invalid { file: origin.to_string(), key: format!("datasets.{name}"), message })
        }
        other => TuneError::Experiment(crate::ExperimentError::Invalid {
            file: origin.to_string(),
            key: "datasets".into(),
            message: other.to_string(),
        }),
    })
}

#[cfg(not(feature = "data"))]
async fn plan_datasets(_: &ExperimentFile, origin: &str, _: u64) -> Result<trainer::data::DataPlans, TuneError> {
    Err(TuneError::Experiment(crate::ExperimentError::Invalid {
        file: origin.to_string(),
        key: "datasets".into(),
        message: trainer::data::DataError::NotBuilt.to_string(),
    }))
}

/// The plan file of the experiment's data sets: written once when the
/// experiment begins (`plans`), read back as it was when it resumes, so
/// a resumed trial reads the same blocks in the same orders.
fn datasets_file(exp_dir: &Path, file: &ExperimentFile, plans: Option<trainer::data::DataPlans>) -> Result<Option<PathBuf>, TuneError> {
    let path = exp_dir.join(trainer::data::PLAN_FILE);
    let io = |source| TuneError::Io { path: path.clone(), source };
    match plans {
        Some(plans) => {
            let text = serde_json::to_vec_pretty(&plans).map_err(|e| io(std::io::Error::other(e)))?;
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, text).map_err(io)?;
            std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io)?;
            std::fs::rename(&tmp, &path).map_err(io)?;
            Ok(Some(path))
        }
        None if path.exists() => Ok(Some(path)),
        None if file.datasets.is_empty() => Ok(None),
        None => Err(io(std::io::Error::new(std::io::ErrorKind::NotFound, "the experiment has [datasets] but no plan of them"))),
    }
}
