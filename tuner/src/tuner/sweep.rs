//! A sweep, in its stages: [`Tuner::serve`] the Python code it calls,
//! [`Tuner::check`] everything before anything is written,
//! [`Checked::start`] its store and its trials' engine, [`Tuner::parts`]
//! of the loop, the loop itself, and [`wind_up`]. Each stage takes what
//! the one before it made; only the last two run whatever way the sweep
//! ends.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use schedulers::{CombinedStopper, MetricThresholds, Scheduler, Stopper};
use search::{BasicVariantGenerator, Domain, Searcher, Space};
use trainer::{Backend, Request, ResourcePool, ScalingConfig, Storage, TrainLoop};

use super::Tuner;
use crate::config::Kind;
use crate::curves::{ArmSearcher, SimBackend};
use crate::experiment::{ExperimentError, ExperimentFile, Resolved};
use crate::hooks::{Channel, PythonHooks};
use crate::opening::{self, Errored, Opened};
use crate::placement::{Nodes, Placement, Startup};
use crate::runner::keep::Keep;
use crate::runner::{experiment_info, Clock, Durability, FilesForPeople, Finish, Parts, Reporter, Runner, Settings, WallClock};
use crate::store::Store;
use crate::{Trainable, TuneError};

/// The Python code a sweep calls (stage 1), and the channel to the driver that serves it.
struct Served {
    hooks: PythonHooks,
    channel: Option<Arc<Channel>>,
}

/// What a sweep will run, every part checked and nothing yet written (stage 2).
struct Checked {
    file: ExperimentFile,
    resuming: bool,
    searcher: Box<dyn Searcher>,
    scheduler: Box<dyn Scheduler>,
    kind: Kind,
    scaling: ScalingConfig,
    /// Absolute, so workers with another working directory find their trial directory.
    exp_dir: PathBuf,
    storage: Storage,
    request: Request,
    placement: Box<dyn Placement>,
    nodes: Nodes,
    /// Whether the scheduler's calls are journaled (not for a replay of recorded curves).
    journal: bool,
    keep: Option<Keep>,
    /// The data sets' plan, made now when the sweep begins (read back when it resumes).
    plans: Option<trainer::data::DataPlans>,
}

/// A sweep whose store is open and whose trials' engine is up (stage 3).
struct Started {
    file: ExperimentFile,
    resuming: bool,
    searcher: Box<dyn Searcher>,
    exp_dir: PathBuf,
    storage: Storage,
    request: Request,
    pool: ResourcePool,
    keep: Option<Keep>,
    opened: Opened,
    datasets: Option<PathBuf>,
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    /// Lines for people: where the trials run.
    notes: Vec<String>,
    /// Ranks are processes whose logs the console shows.
    echo_ranks: bool,
}

impl Tuner {
    /// The sweep: its experiment directory and store once it is over.
    pub(super) async fn sweep(mut self) -> Result<(PathBuf, Store), TuneError> {
        let served = self.serve()?;
        let checked = self.check(&served).await?;
        let started = checked.start(self.errored).await?;
        let (exp_dir, store) = (started.exp_dir.clone(), started.opened.store.clone());
        let slurm_jobs = started.file.cluster.backend == trainer::ClusterBackend::SlurmJobs;
        let remote = (!started.storage.is_local()).then(|| started.storage.clone());
        let parts = self.parts(&served, started)?;
        // An experiment in an object store: what a Python driver wrote for it goes up now, the files for
        // people when the sweep ends (its store is mirrored at every flush).
        if let Some(r) = &remote {
            if let Err(e) = crate::remote::push(&exp_dir, r, "driver").await {
                tracing::warn!("copying the driver's files to {}: {e}", r.uri("driver"));
            }
        }
        let (runner, inputs) = Runner::new(parts);
        let finish = runner.run(inputs).await;
        wind_up(&exp_dir, slurm_jobs, remote.as_ref()).await;
        match finish? {
            Finish::Interrupted => Err(TuneError::Interrupted(exp_dir)),
            Finish::Done => Ok((exp_dir, store)),
        }
    }

    /// Stage 1: the Python code the sweep calls, served by the driver
    /// that runs it (a `Tuner(...).fit()` in a script); refused from the
    /// `nestor` command, which has no driver.
    fn serve(&mut self) -> Result<Served, TuneError> {
        let hooks = self.file.python.clone();
        if hooks.is_empty() {
            return Ok(Served { hooks, channel: None });
        }
        let channel = Channel::from_env().map_err(TuneError::Hooks)?.ok_or_else(|| {
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
        Ok(Served { hooks, channel: Some(channel) })
    }

    /// Stage 2: everything checked before anything is written. Settings
    /// made in Rust get the checks a file gets, and the sweep runs what
    /// was checked (a Rust space as it was built, not read back from its
    /// TOML); an object store and the nodes answer, the data sets are
    /// planned.
    async fn check(&mut self, served: &Served) -> Result<Checked, TuneError> {
        // A sweep stopped before its first commit recorded nothing to resume: it begins anew in its directory.
        let resuming = self.restore_dir.is_some() && !self.restore_anew;
        if self.file.experiment.seed.is_none() {
            self.file.experiment.seed = Some(random_seed());
        }
        let Resolved { file, space: checked_space, points, scheduler: configured, .. } =
            self.file.clone().resolve_with(&self.origin, self.space.take())?;
        let origin = self.origin.clone();
        let invalid = |key: String, message: String| TuneError::Experiment(ExperimentError::Invalid { file: origin.clone(), key, message });
        let points = self.points.take().unwrap_or(points);
        let seed = file.experiment.seed.unwrap_or(0);
        let trainable = match (self.trainable.take(), &file.trainer) {
            (Some(t), _) => t,
            (None, Some(t)) => {
                let config = t.process_config().map_err(|e| invalid(format!("trainer.{}", e.key), e.message))?;
                crate::Trainable::process(config).scaling(t.scaling())
            }
            (None, None) => return Err(TuneError::NoTrainer),
        };
        let searcher = self.searcher(&file, served, &trainable.kind, checked_space, points, seed)?;
        let scheduler: Box<dyn Scheduler> = self.custom_scheduler.take().unwrap_or(configured);
        trainable.scaling.validate()?;
        let exp_dir = std::path::absolute(self.experiment_dir()).map_err(|source| TuneError::Io { path: self.experiment_dir(), source })?;
        // Checkpoints: an object store must answer before anything is written.
        let storage = match file.experiment.storage_url() {
            Some(url) => {
                let root = Storage::parse(url).map_err(TuneError::Storage)?.join(&file.experiment.name);
                root.probe().await.map_err(TuneError::Storage)?;
                root
            }
            None => Storage::local(&exp_dir),
        };
        // Where the trials run.
        if let Some(bind) = file.trainer.as_ref().and_then(|t| t.report_bind) {
            std::net::TcpListener::bind(bind)
                .map_err(|e| invalid("trainer.report_bind".into(), format!("cannot listen on {bind}: {e}")))?;
        }
        let request = Request::from_scaling(&trainable.scaling);
        let mut placement = crate::placement::find(&file, &trainable.kind, self.resources.take())?;
        placement.check(&Startup { file: &file, exp_dir: &exp_dir, storage: &storage, resuming, request: &request }).await?;
        let nodes = placement.nodes();
        // A trial that can never fit is refused now, not left pending.
        nodes.pool.check(&request)?;
        let journal = !matches!(trainable.kind, Kind::Simulated(_));
        let keep = match self.keep.take() {
            None => None,
            Some(_) if journal => {
                return Err(invalid(
                    "keep_best".into(),
                    "for simulations only: a real trial's files and checkpoints would outlive its record".into(),
                ))
            }
            Some((n, fold)) => {
                let metric = file
                    .experiment
                    .metric
                    .clone()
                    .ok_or_else(|| invalid("keep_best".into(), "needs experiment.metric to rank the trials".into()))?;
                Some(Keep::new(n, metric, file.experiment.mode.unwrap_or(search::Mode::Min), fold))
            }
        };
        // Data sets: planned (and refused by file) before anything is written.
        let plans = if resuming || file.datasets.is_empty() { None } else { Some(plan_datasets(&file, &self.origin, seed).await?) };
        let Trainable { kind, scaling, .. } = trainable;
        Ok(Checked {
            file,
            resuming,
            searcher,
            scheduler,
            kind,
            scaling,
            exp_dir,
            storage,
            request,
            placement,
            nodes,
            journal,
            keep,
            plans,
        })
    }

    /// The searcher: one set in Rust, the driver's Python one, or the
    /// file's (over a replay's recorded configs where its space is
    /// empty), wrapped by the file's limits and the driver's sampling.
    fn searcher(
        &mut self,
        file: &ExperimentFile,
        served: &Served,
        kind: &Kind,
        checked_space: Space,
        points: Vec<search::Config>,
        seed: u64,
    ) -> Result<Box<dyn Searcher>, TuneError> {
        let Served { hooks, channel } = served;
        // A curves file with no space of the experiment's own: the space is a choice of its configs.
        let arms = match kind {
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
        let mut searcher: Box<dyn Searcher> = match (self.custom_searcher.take(), channel) {
            (Some(custom), _) => custom,
            (None, Some(channel)) if hooks.search => file.search.around(Box::new(crate::hooks::PythonSearcher::new(Arc::clone(channel)))),
            (None, _) => file.search.around(basic),
        };
        if let (true, Some(channel)) = (hooks.sample, channel) {
            searcher = Box::new(crate::hooks::PythonSampled::new(searcher, Arc::clone(channel), seed));
        }
        Ok(searcher)
    }

    /// Stage 4: the loop's parts: its stoppers, how many trials at a time,
    /// the console and the callbacks, its settings.
    fn parts(&mut self, served: &Served, started: Started) -> Result<Parts, TuneError> {
        let Started {
            file,
            resuming,
            searcher,
            exp_dir,
            storage,
            request,
            pool,
            keep,
            opened,
            datasets,
            backend,
            clock,
            notes,
            echo_ranks,
        } = started;
        let Opened { store, scheduler, pending, paused, next_index, finished, unflushed } = opened;
        let Served { hooks, channel } = served;
        let mut stoppers: Vec<Box<dyn Stopper>> = vec![Box::new(MetricThresholds(file.stop.clone()))];
        stoppers.extend(self.custom_stop.take());
        if let (true, Some(channel)) = (hooks.stop, channel) {
            stoppers.push(Box::new(crate::hooks::PythonStopper::new(Arc::clone(channel))));
        }
        // Trials run as the node's resources allow, capped by max_concurrent_trials.
        let fit = {
            let mut probe = pool.clone();
            std::iter::from_fn(|| probe.try_allocate(&request)).take(100_000).count().max(1)
        };
        let max_concurrent = file.experiment.max_concurrent_trials.unwrap_or(usize::MAX).min(fit);
        let planned = searcher.total_trials().unwrap_or(file.experiment.num_samples);
        let mut progress = crate::progress::Progress::new(self.progress, file.experiment.metric.clone());
        if echo_ranks {
            progress.echo_ranks(exp_dir.clone());
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
        let files = (durability == Durability::EveryBatch).then_some(if file.experiment.trial_files {
            FilesForPeople::PerTrial
        } else {
            FilesForPeople::Experiment
        });
        let mut callbacks = Vec::new();
        for (i, c) in file.callbacks.iter().enumerate() {
            callbacks.push(c.build(&exp_dir, &file.experiment.name).map_err(|message| {
                TuneError::Experiment(ExperimentError::Invalid { file: self.origin.clone(), key: format!("callbacks[{i}]"), message })
            })?);
        }
        callbacks.append(&mut self.callbacks);
        if let Some(channel) = channel.as_ref().filter(|_| !hooks.callbacks.is_empty()) {
            callbacks.extend(channel.callback(&hooks.callbacks));
        }
        let info = experiment_info(exp_dir.clone(), &file, planned, resuming);
        let reporter = Reporter::new(info, progress, files, finished, callbacks, self.callback_deadline);
        let settings = Settings {
            exp_dir,
            rank_metrics: hooks.rank_metrics,
            metric: file.experiment.metric.clone(),
            max_concurrent,
            max_trials: planned,
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
        Ok(Parts {
            settings,
            store,
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
            unflushed,
        })
    }
}

impl Checked {
    /// Stage 3: the store created (or reopened, its trials in ERROR
    /// treated as `errored` says), the data sets' plan written, and the
    /// engine that runs the trials started.
    async fn start(self, errored: Errored) -> Result<Started, TuneError> {
        let Checked {
            file,
            resuming,
            mut searcher,
            scheduler,
            kind,
            scaling,
            exp_dir,
            storage,
            request,
            placement,
            nodes,
            journal,
            keep,
            plans,
        } = self;
        let store_dir = exp_dir.join("store");
        let opened = if resuming {
            opening::resume(&store_dir, &storage, &mut *searcher, scheduler, journal, errored).await?
        } else {
            opening::create(&exp_dir, &storage, &file, &*searcher, scheduler, journal).await?
        };
        let datasets = datasets_file(&exp_dir, &file, plans)?;
        let Nodes { pool, description, notes: node_notes } = nodes;
        let mut notes = vec![format!("nestor: {description}")];
        notes.extend(node_notes);
        // Ranks that are processes write logs, shown on the console as they come.
        let echo_ranks = file.experiment.log_to_driver && matches!(kind, Kind::Train(TrainLoop::Process(_)));
        // A replay of recorded curves is a backend that is also the loop's (virtual) clock.
        let (backend, clock): (Arc<dyn Backend>, Arc<dyn Clock>) = match kind {
            Kind::Simulated(curves) => {
                let sim = Arc::new(SimBackend::new(curves));
                (sim.clone(), sim)
            }
            Kind::Train(TrainLoop::Function(f)) => (Arc::new(f), Arc::new(WallClock::new())),
            Kind::Train(TrainLoop::Process(mut c)) => {
                c.use_gpu = scaling.use_gpu;
                // Ranks on nodes that do not see the plan fetch it from the driver.
                c.files.extend(datasets.iter().cloned());
                let startup = Startup { file: &file, exp_dir: &exp_dir, storage: &storage, resuming, request: &request };
                let launcher = placement.backend(c, &startup).await?;
                notes.extend(launcher.notes);
                (launcher.backend, Arc::new(WallClock::new()))
            }
        };
        Ok(Started { file, resuming, searcher, exp_dir, storage, request, pool, keep, opened, datasets, backend, clock, notes, echo_ranks })
    }
}

/// Stage 6, whatever way the sweep ended: no Slurm job of its own left in
/// the queue (one requeued as its run ended would start later and run the
/// trial again on someone's nodes), and the files for people copied to
/// the experiment's object store.
async fn wind_up(exp_dir: &Path, slurm_jobs: bool, remote: Option<&Storage>) {
    if slurm_jobs {
        match trainer::cancel_leftover_jobs(exp_dir).await {
            Ok(left) if !left.is_empty() => {
                let ids: Vec<String> = left.iter().map(|r| format!("{} ({}, {:?})", r.id, r.name, r.state)).collect();
                eprintln!("nestor: cancelled {} job(s) of this sweep still in Slurm's queue: {}", left.len(), ids.join(", "));
            }
            Ok(_) => {}
            Err(e) => eprintln!("nestor: could not check Slurm's queue for jobs of this sweep: {}", e.0),
        }
    }
    if let Some(r) = remote {
        match crate::remote::push(exp_dir, r, "").await {
            Ok(n) => tracing::debug!("copied {n} files to {}", r.uri("")),
            Err(e) => eprintln!("nestor: could not copy the experiment's files to {}: {e}", r.uri("")),
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

/// Plans the experiment's `[datasets]` (with the planner nestor-data
/// installs): a refusal names the data set and its file.
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
