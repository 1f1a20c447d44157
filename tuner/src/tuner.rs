//! `Tuner`: builds an experiment (from Rust or from a file), runs it, and
//! restores it after a crash.

use std::path::{Path, PathBuf};
use std::time::Duration;

use schedulers::{Scheduler, Stopper};
use search::{SearchConfig, Searcher, Space};
use trainer::NodeResources;

use crate::callback::Callback;
use crate::config::{ProgressMode, RunConfig, Stop, Trainable, TuneConfig};
use crate::experiment::ExperimentFile;
use crate::opening::Errored;
use crate::result_grid::ResultGrid;
use crate::store::Store;
use crate::TuneError;

mod sweep;

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
    /// The store in `restore_dir` holds nothing (its sweep was stopped before
    /// its first commit): the sweep begins anew there instead of resuming.
    restore_anew: bool,
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
            restore_anew: false,
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
            restore_anew: false,
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
    /// trial runs, by the planner the crate nestor-data installs
    /// (`data::install()`, called first; without it `fit` refuses the data
    /// set by name), and each rank reads its share with nestor-data's
    /// `dataset_shard` (from [`Context::dataset_plan`](trainer::Context::dataset_plan)).
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
        let store_dir = dir.join("store");
        let begun = crate::opening::open_begun(&store_dir)?;
        let anew = begun.is_none();
        let text = match begun {
            Some(store) => store.experiment()?.ok_or_else(|| TuneError::Corrupt(dir.clone(), "the store holds no experiment".into()))?,
            // Stopped before its first commit, nothing of it recorded: it begins
            // anew, as the file it was written with says (its seed included).
            None => std::fs::read_to_string(dir.join("experiment.toml")).map_err(|e| {
                TuneError::Corrupt(dir.clone(), format!("its store holds nothing, and its experiment.toml cannot be read: {e}"))
            })?,
        };
        let file = ExperimentFile::from_toml(&text, &origin, sets)?;
        let mut t = Tuner::from_file(file, origin, trainable);
        t.restore_dir = Some(dir);
        t.restore_anew = anew;
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
}
