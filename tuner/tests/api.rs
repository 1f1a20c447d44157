//! The Rust API: in-process function trainables, stop criteria, failures,
//! points to evaluate, grid search, seeds, and restore.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use search::{Domain, Mode, Space};
use tuner::{Algorithm, ProgressMode, ReportError, RunConfig, Scope, Stop, Trainable, TuneConfig, Tuner};

fn space() -> Space {
    Space::builder().param("x", Domain::uniform(-1.0, 1.0)).param("opt", Domain::grid(["adam", "sgd"])).build().unwrap()
}

fn quadratic() -> Trainable {
    Trainable::function(|ctx| {
        let x: f64 = ctx.param("x")?;
        for step in 1..=10u32 {
            ctx.report([("loss", (x - 0.25).powi(2) + 1.0 / f64::from(step))], None)?;
        }
        Ok(())
    })
}

fn tune(samples: u64, seed: u64) -> TuneConfig {
    TuneConfig {
        metric: Some("loss".into()),
        mode: Some(Mode::Min),
        num_samples: samples,
        max_concurrent_trials: Some(4),
        seed: Some(seed),
        ..Default::default()
    }
}

fn run(dir: &std::path::Path, name: &str, stop: Stop) -> RunConfig {
    RunConfig { name: name.into(), storage: dir.to_path_buf(), stop, progress: ProgressMode::Quiet, ..Default::default() }
}

#[test]
fn grid_times_samples_and_the_best_result() {
    let dir = tempfile::tempdir().unwrap();
    let grid = Tuner::new(quadratic(), space()).tune_config(tune(3, 1)).run_config(run(dir.path(), "g", Stop::new())).fit().unwrap();
    assert_eq!(grid.len(), 6);
    assert_eq!(grid.num_terminated(), 6);
    let opts: Vec<String> = grid.iter().map(|t| t.config["opt"].as_str().unwrap().to_string()).collect();
    assert_eq!(opts.iter().filter(|o| *o == "adam").count(), 3);
    let best = grid.best_result(None, None, Scope::Last).unwrap();
    let best_x = best.config["x"].as_f64().unwrap();
    for t in grid.iter() {
        assert!((t.config["x"].as_f64().unwrap() - 0.25).abs() >= (best_x - 0.25).abs());
        assert_eq!(t.history.len(), 10);
    }
    // The store answers the same after the fact.
    let again = tuner::ResultGrid::load(&dir.path().join("g")).unwrap();
    assert_eq!(again.best_result(None, None, Scope::Last).unwrap().trial_id, best.trial_id);
}

#[test]
fn same_seed_same_configs() {
    let dir = tempfile::tempdir().unwrap();
    let a =
        Tuner::new(quadratic(), space()).tune_config(tune(4, 7)).run_config(run(dir.path(), "a", Stop::new().iterations(1))).fit().unwrap();
    let b =
        Tuner::new(quadratic(), space()).tune_config(tune(4, 7)).run_config(run(dir.path(), "b", Stop::new().iterations(1))).fit().unwrap();
    let c =
        Tuner::new(quadratic(), space()).tune_config(tune(4, 8)).run_config(run(dir.path(), "c", Stop::new().iterations(1))).fit().unwrap();
    let configs = |g: &tuner::ResultGrid| g.iter().map(|t| t.config.clone()).collect::<Vec<_>>();
    assert_eq!(configs(&a), configs(&b));
    assert_ne!(configs(&a), configs(&c));
}

#[test]
fn stoppers_end_trials_through_report() {
    let dir = tempfile::tempdir().unwrap();
    let stopped_by_report = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&stopped_by_report);
    let trainable = Trainable::function(move |ctx| {
        for step in 1..=100 {
            match ctx.report([("loss", 1.0 / f64::from(step))], None) {
                Ok(()) => {}
                Err(ReportError::Stopped) => {
                    seen.fetch_add(1, Ordering::SeqCst);
                    return Err(ReportError::Stopped.into());
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    });
    let stop = Stop::new().iterations(50).when(|_, r| r.metric("loss").is_some_and(|l| l < 0.2));
    let grid = Tuner::new(trainable, space()).tune_config(tune(1, 1)).run_config(run(dir.path(), "s", stop)).fit().unwrap();
    assert_eq!(stopped_by_report.load(Ordering::SeqCst), 2);
    for t in grid.iter() {
        assert_eq!(t.status.as_str(), "TERMINATED");
        assert_eq!(t.history.last().unwrap().training_iteration, 6, "1/6 < 0.2 is the first stop");
    }
}

#[test]
fn errors_and_panics_are_recorded_and_the_sweep_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let trainable = Trainable::function(|ctx| {
        let x: f64 = ctx.param("x")?;
        ctx.report([("loss", x)], None)?;
        match ctx.param::<String>("opt")?.as_str() {
            "adam" => Err("diverged".into()),
            _ => panic!("boom at x={x}"),
        }
    });
    let grid = Tuner::new(trainable, space()).tune_config(tune(2, 3)).run_config(run(dir.path(), "e", Stop::new())).fit().unwrap();
    assert_eq!(grid.num_errors(), 4);
    let msgs: Vec<String> = grid.errors().iter().map(|t| t.error.clone().unwrap()).collect();
    assert!(msgs.iter().any(|m| m == "diverged"));
    assert!(msgs.iter().any(|m| m.starts_with("the training function panicked: boom at x=")));
    // What they reported before failing is kept.
    assert!(grid.iter().all(|t| t.history.len() == 1));
}

#[test]
fn points_to_evaluate_run_first_and_nan_is_never_best() {
    let dir = tempfile::tempdir().unwrap();
    let trainable = Trainable::function(|ctx| {
        let x: f64 = ctx.param("x")?;
        let loss = if x == 0.5 { f64::NAN } else { (x - 0.25).powi(2) };
        ctx.report([("loss", loss)], None)?;
        Ok(())
    });
    let space = Space::builder().param("x", Domain::uniform(-1.0, 1.0)).build().unwrap();
    let config = TuneConfig {
        points_to_evaluate: vec![serde_json::json!({"x": 0.5}), serde_json::json!({"x": 0.25})],
        search: Algorithm::Random,
        ..tune(5, 2)
    };
    let grid = Tuner::new(trainable, space).tune_config(config).run_config(run(dir.path(), "p", Stop::new())).fit().unwrap();
    let xs: Vec<f64> = grid.iter().map(|t| t.config["x"].as_f64().unwrap()).collect();
    assert_eq!(&xs[..2], [0.5, 0.25]);
    assert_eq!(xs.len(), 5);
    let best = grid.best_result(None, None, Scope::Last).unwrap();
    assert_eq!(best.config["x"], 0.25);
    assert!(grid.get("trial_00000").unwrap().metrics.as_ref().unwrap()["loss"].is_nan());
    assert_ne!(grid.best_result(None, Some(Mode::Max), Scope::Last).unwrap().trial_id, "trial_00000", "NaN is never best, in either mode");
}

#[test]
fn a_bad_point_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let config = TuneConfig { points_to_evaluate: vec![serde_json::json!({"x": 3.0})], ..tune(2, 2) };
    let err = Tuner::new(quadratic(), space()).tune_config(config).run_config(run(dir.path(), "bad", Stop::new())).fit().unwrap_err();
    assert_eq!(err.to_string(), "experiment: search.points_to_evaluate[0].x: 3.0 is outside uniform [-1, 1)");
    assert!(!dir.path().join("bad").exists());
}

#[test]
fn data_sets_without_nestor_datas_planner_are_refused_by_name_before_anything_is_written() {
    // This program leaves out nestor-data: nothing installs a planner.
    let dir = tempfile::tempdir().unwrap();
    let spec = trainer::data::DatasetSpec::Path(trainer::data::Paths::One("train.parquet".into()));
    let err = Tuner::new(quadratic(), space())
        .tune_config(tune(2, 2))
        .run_config(run(dir.path(), "data", Stop::new()))
        .dataset("train", spec)
        .fit()
        .unwrap_err()
        .to_string();
    assert!(err.contains("datasets.train") && err.contains("nestor-data") && err.contains("data::install()"), "{err}");
    assert!(!dir.path().join("data").exists());
}

#[test]
fn settings_made_in_rust_get_the_checks_a_file_gets() {
    let dir = tempfile::tempdir().unwrap();
    let refuse = |config: TuneConfig| {
        let err = Tuner::new(quadratic(), space()).tune_config(config).run_config(run(dir.path(), "bad", Stop::new())).fit().unwrap_err();
        assert!(!dir.path().join("bad").exists());
        err.to_string()
    };
    let promotion = tuner::SchedulerConfig::Asha(tuner::AshaConfig { asha_type: tuner::AshaType::Promotion, ..Default::default() });
    assert!(refuse(TuneConfig { scheduler: promotion, ..tune(2, 2) }).starts_with("experiment: scheduler.asha_type:"));
    let bad_rf = tuner::SchedulerConfig::Hyperband(tuner::HyperBandConfig { reduction_factor: 1.0, ..Default::default() });
    assert!(refuse(TuneConfig { scheduler: bad_rf, ..tune(2, 2) })
        .starts_with("experiment: scheduler.reduction_factor: must be greater than 1"));
    let tpe = TuneConfig { search: tuner::Algorithm::Tpe, metric: None, mode: None, ..tune(2, 2) };
    assert!(refuse(tpe).contains("experiment.metric: required by search.algorithm = \"tpe\""));
}

/// A scheduler of our own: stops a trial at iteration 2 when its loss is above 0.5.
struct CutAt2;

impl schedulers::Scheduler for CutAt2 {
    fn on_trial_result(&mut self, _trial: &schedulers::TrialView<'_>, result: &search::TrialResult) -> schedulers::Decision {
        if result.training_iteration == 2 && result.metric("loss").is_some_and(|l| l > 0.5) {
            schedulers::Decision::Stop
        } else {
            schedulers::Decision::Continue
        }
    }
}

/// A searcher of our own: x = 0.0, 0.1, ..., 0.9.
struct Ladder(u64);

impl search::Searcher for Ladder {
    fn suggest(&mut self, _trial_id: &str) -> search::Suggestion {
        if self.0 == 10 {
            return search::Suggestion::Finished;
        }
        self.0 += 1;
        search::Suggestion::Config(serde_json::json!({ "x": (self.0 - 1) as f64 / 10.0 }))
    }
    fn total_trials(&self) -> Option<u64> {
        Some(10)
    }
    fn save(&self) -> serde_json::Value {
        serde_json::json!({ "version": 1, "next": self.0 })
    }
    fn restore(&mut self, state: &serde_json::Value) -> Result<(), search::SearchError> {
        self.0 = state["next"].as_u64().ok_or_else(|| search::SearchError::State("no next".into()))?;
        Ok(())
    }
}

#[test]
fn searchers_and_schedulers_of_your_own_plug_in() {
    let dir = tempfile::tempdir().unwrap();
    let trainable = Trainable::function(|ctx| {
        let x: f64 = ctx.param("x")?;
        for _ in 0..5 {
            ctx.report([("loss", x)], None)?;
        }
        Ok(())
    });
    let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
    let grid = Tuner::new(trainable, space)
        .tune_config(tune(1, 0))
        .run_config(run(dir.path(), "own", Stop::new()))
        .with_searcher(Box::new(Ladder(0)))
        .with_scheduler(Box::new(CutAt2))
        .fit()
        .unwrap();
    assert_eq!(grid.len(), 10);
    for t in grid.iter() {
        let x = t.config["x"].as_f64().unwrap();
        let expected = if x > 0.5 { 2 } else { 5 };
        assert_eq!(t.history.len(), expected, "x = {x}");
        assert_eq!(t.status.as_str(), "TERMINATED");
    }
}

/// A stress test of the group commit: trials ending alone (no result rides
/// with their end) while other trials keep flushes in flight all the time.
/// The sweep finishes, with every result stored.
#[test]
fn trials_ending_while_results_stream_in_all_finish_with_every_result() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let trainable = Trainable::function(|ctx| {
            let x: f64 = ctx.param("x")?;
            if x < 0.0 {
                // Busy: results all the time, so flushes are always under way.
                for step in 0..200 {
                    ctx.report([("loss", x + f64::from(step))], None)?;
                }
            } else {
                // Quiet: one result, then an end that comes alone.
                ctx.report([("loss", x)], None)?;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Ok(())
        });
        let grid = Tuner::new(trainable, Space::builder().param("x", Domain::uniform(-1.0, 1.0)).build().unwrap())
            .resources(tuner::NodeResources::declared(16.0))
            .tune_config(TuneConfig { max_concurrent_trials: Some(16), ..tune(200, 3) })
            .run_config(run(&storage, "many", Stop::new()))
            .fit();
        let _ = tx.send(grid.map(|g| (g.num_terminated(), g.iter().map(|t| t.history.len()).collect::<Vec<_>>())));
    });
    let (terminated, lengths) = rx.recv_timeout(std::time::Duration::from_secs(120)).expect("the sweep stalled").unwrap();
    assert_eq!(terminated, 200);
    assert!(lengths.iter().all(|&n| n == 1 || n == 200), "{lengths:?}");
}

/// A result without the scheduler's time attribute is an error on its trial
/// (naming the metric and the setting), not a silent continue; the other
/// trials go on.
#[test]
fn a_result_without_the_schedulers_time_attr_fails_its_trial() {
    let dir = tempfile::tempdir().unwrap();
    let trainable = Trainable::function(|ctx| {
        let x: f64 = ctx.param("x")?;
        for step in 1..=4u32 {
            let mut metrics = vec![("loss", x * x)];
            // Trials with a positive x forget the epoch counter.
            if x <= 0.0 {
                metrics.push(("epoch", f64::from(step)));
            }
            ctx.report(metrics, None)?;
        }
        Ok(())
    });
    let asha = tuner::SchedulerConfig::Asha(tuner::AshaConfig { time_attr: "epoch".into(), max_t: 4.0, ..Default::default() });
    let grid = Tuner::new(trainable, space())
        .tune_config(TuneConfig { scheduler: asha, ..tune(4, 3) })
        .run_config(run(dir.path(), "no-epoch", Stop::new()))
        .fit()
        .unwrap();
    assert_eq!(grid.len(), 8);
    assert!(grid.num_errors() > 0 && grid.num_terminated() > 0, "the seed gives both signs of x");
    for t in grid.iter() {
        if t.config["x"].as_f64().unwrap() > 0.0 {
            assert_eq!(t.status, tuner::TrialStatus::Error);
            let e = t.error.as_deref().unwrap();
            assert!(e.starts_with("trial reported no `epoch` (scheduler.time_attr); it reported: loss"), "{e}");
            assert_eq!(t.history.len(), 1, "the bad result is stored, then the trial ends");
        } else {
            assert_eq!(t.status, tuner::TrialStatus::Terminated, "{}", t.trial_id);
        }
    }
}

/// `repeat`: each config runs several times, told apart by `__trial_index__`,
/// and TPE learns from the mean of the repeats.
#[test]
fn each_config_repeats_with_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let trainable = Trainable::function(|ctx| {
        let x: f64 = ctx.param("x")?;
        let index: f64 = ctx.param("__trial_index__")?;
        ctx.report([("loss", x * x + index)], None)?;
        Ok(())
    });
    let space = Space::builder().param("x", Domain::uniform(-1.0, 1.0)).build().unwrap();
    let config = TuneConfig { repeat: Some(3), search: Algorithm::Tpe, max_concurrent_trials: Some(2), ..tune(12, 8) };
    let grid = Tuner::new(trainable, space).tune_config(config).run_config(run(dir.path(), "repeat", Stop::new())).fit().unwrap();
    assert_eq!(grid.len(), 12, "num_samples counts trials, repeats included");
    let trials: Vec<&tuner::TrialOutcome> = grid.iter().collect();
    for (i, t) in trials.iter().enumerate() {
        assert_eq!(t.config["__trial_index__"], (i % 3) as u64, "{}", t.trial_id);
        assert_eq!(t.config["x"], trials[i / 3 * 3].config["x"], "a config's repeats share it");
        assert_eq!(t.metrics.as_ref().unwrap()["loss"], t.config["x"].as_f64().unwrap().powi(2) + (i % 3) as f64);
    }
    assert_ne!(trials[0].config["x"], trials[3].config["x"]);
    // Random search too: num_samples counts trials.
    let random = TuneConfig { repeat: Some(3), ..tune(6, 8) };
    let trainable = Trainable::function(|ctx| ctx.report([("loss", ctx.param::<f64>("x")?)], None).map_err(Into::into));
    let space = Space::builder().param("x", Domain::uniform(-1.0, 1.0)).build().unwrap();
    let grid = Tuner::new(trainable, space).tune_config(random).run_config(run(dir.path(), "repeat-random", Stop::new())).fit().unwrap();
    assert_eq!(grid.len(), 6);
    assert_eq!(grid.iter().filter(|t| t.config["__trial_index__"] == 2).count(), 2);
}

/// Every search setting a file can hold can be set in Rust, and survives:
/// into the experiment the sweep writes (and resumes from), and through a
/// later `tune_config` that leaves it out.
#[test]
fn tpe_and_bohb_settings_set_in_rust_survive() {
    let dir = tempfile::tempdir().unwrap();
    let read = |name: &str| -> toml::Table {
        toml::from_str(&std::fs::read_to_string(dir.path().join(name).join("experiment.toml")).unwrap()).unwrap()
    };
    let tpe = search::TpeOptions { n_startup_trials: 2, n_ei_candidates: 7, multivariate: true };
    Tuner::new(quadratic(), space())
        .tune_config(TuneConfig { search: Algorithm::Tpe, tpe: Some(tpe), ..tune(3, 1) })
        .run_config(run(dir.path(), "tpe", Stop::new()))
        .fit()
        .unwrap();
    let file = read("tpe");
    assert_eq!(file["search"]["algorithm"].as_str(), Some("tpe"));
    assert_eq!(file["search"]["n_startup_trials"].as_integer(), Some(2));
    assert_eq!(file["search"]["n_ei_candidates"].as_integer(), Some(7));
    assert_eq!(file["search"]["multivariate"].as_bool(), Some(true));

    // A file's settings stay when Rust sets the rest.
    let text = std::fs::read_to_string(dir.path().join("tpe").join("experiment.toml")).unwrap();
    let file = tuner::ExperimentFile::from_toml(&text, "tpe/experiment.toml", &[]).unwrap();
    Tuner::from_file(file, "tpe/experiment.toml", Some(quadratic()))
        .tune_config(TuneConfig { search: Algorithm::Tpe, ..tune(2, 2) })
        .run_config(run(dir.path(), "again", Stop::new()))
        .fit()
        .unwrap();
    let file = read("again");
    assert_eq!(file["search"]["n_startup_trials"].as_integer(), Some(2));
    assert_eq!(file["search"]["multivariate"].as_bool(), Some(true));

    let bohb = search::BohbOptions {
        min_points_in_model: Some(4),
        top_n_percent: 20.0,
        random_fraction: 0.5,
        num_samples: 16,
        bandwidth_factor: 2.0,
        ..Default::default()
    };
    let hyperband = tuner::SchedulerConfig::HyperbandBohb(schedulers::HyperBandConfig { max_t: 9.0, ..Default::default() });
    // HyperBand pauses trials: a replay of curves, whose checkpoints are names.
    let curves = tuner::simulate::Curves::from_fn("loss", |c| tuner::simulate::Curve {
        metrics: (1..=9).map(|t| c["x"].as_f64().unwrap_or(0.0).abs() + 1.0 / f64::from(t)).collect(),
        ..Default::default()
    });
    let checkpoint = tuner::CheckpointConfig { frequency: Some(1.into()), ..Default::default() };
    Tuner::new(Trainable::simulated(curves), space())
        .tune_config(TuneConfig { search: Algorithm::Bohb, bohb: Some(bohb), scheduler: hyperband, ..tune(3, 1) })
        .run_config(RunConfig { checkpoint, ..run(dir.path(), "bohb", Stop::new()) })
        .fit()
        .unwrap();
    let s = read("bohb")["search"].clone();
    assert_eq!(s["min_points_in_model"].as_integer(), Some(4));
    assert_eq!(s["top_n_percent"].as_float(), Some(20.0));
    assert_eq!(s["random_fraction"].as_float(), Some(0.5));
    assert_eq!(s["n_ei_candidates"].as_integer(), Some(16));
    assert_eq!(s["bandwidth_factor"].as_float(), Some(2.0));
}

/// `trial_files = false`: nothing under `trials/`, every result in the store.
#[test]
fn a_sweep_without_trial_files_keeps_every_result_in_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let grid = Tuner::new(quadratic(), space())
        .tune_config(tune(2, 1))
        .run_config(RunConfig { trial_files: false, ..run(dir.path(), "nofiles", Stop::new()) })
        .fit()
        .unwrap();
    assert_eq!(grid.len(), 4);
    assert!(grid.iter().all(|t| t.history.len() == 10));
    let exp = dir.path().join("nofiles");
    let files: Vec<_> = walk(&exp.join("trials")).into_iter().filter(|p| p.is_file()).collect();
    assert!(files.is_empty(), "{files:?}");
    let text = std::fs::read_to_string(exp.join("experiment.toml")).unwrap();
    assert!(text.contains("trial_files = false"), "{text}");
    // The store's results export as files would have held them.
    let again = tuner::ResultGrid::load(&exp).unwrap();
    assert_eq!(again.iter().map(|t| t.history.len()).sum::<usize>(), 40);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn a_sweep_of_a_trainer_keeps_its_config_name_storage_and_failure_settings() {
    let dir = tempfile::tempdir().unwrap();
    let failed = Arc::new(AtomicUsize::new(0));
    let f = Arc::clone(&failed);
    let trainer = trainer::Trainer::function(move |ctx| {
        let epochs: u64 = ctx.param("epochs")?;
        let width: u64 = ctx.param("model.width")?;
        let x: f64 = ctx.param("x")?;
        for step in 1..=epochs {
            // The first run of the first trial fails once, mid-way: max_failures = 1 lets it restart.
            if step == 2 && ctx.checkpoint().is_none() && f.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err("failing once".into());
            }
            ctx.report([("loss", x * x + 1.0 / (step as f64)), ("width", width as f64)], None)?;
        }
        Ok(())
    })
    .config(serde_json::json!({"epochs": 3, "x": 5.0, "model": {"width": 32}}))
    .name("from-trainer")
    .storage(dir.path())
    .failure(trainer::FailureConfig { max_failures: 1, ..Default::default() });
    let space = Space::builder().param("x", Domain::uniform(-1.0, 1.0)).build().unwrap();
    let grid = Tuner::new(trainer.into(), space).progress(ProgressMode::Quiet).fit().unwrap();
    assert!(dir.path().join("from-trainer/store").is_dir(), "the trainer's name and storage");
    assert_eq!(failed.load(Ordering::SeqCst), 2, "a failed run, then the restart's step 2");
    let t = &grid.iter().next().unwrap();
    assert_eq!(t.status.as_str(), "TERMINATED", "{:?}", t.error);
    assert_eq!((t.failures, t.history.len()), (1, 3), "restarted once; the trainer's epochs");
    assert_eq!(t.config["epochs"], 3);
    assert_eq!(t.config["model"]["width"], 32);
    assert!(t.config["x"].as_f64().unwrap().abs() <= 1.0, "the space's x, not the trainer's");
}
