//! Ctrl-C during a Rust-function sweep, then `Tuner::restore`: the trial
//! restarts from its latest committed checkpoint and its history continues.
//! (Its own test binary: it signals its own process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use search::{Domain, Mode, Space};
use tuner::{ProgressMode, RunConfig, Stop, Trainable, TuneConfig, TuneError, Tuner};

#[test]
fn interrupt_then_restore_continues_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let make = |runs: Arc<AtomicUsize>, starts: Arc<std::sync::Mutex<Vec<u32>>>| {
        Trainable::function(move |ctx| {
            let first_run = runs.fetch_add(1, Ordering::SeqCst) == 0;
            let mut start = 0u32;
            if let Some(dir) = ctx.checkpoint() {
                start = std::fs::read_to_string(dir.join("step"))?.parse()?;
            }
            starts.lock().unwrap().push(start);
            let scratch = tempfile::tempdir()?;
            for step in start + 1..=6 {
                std::fs::write(scratch.path().join("step"), step.to_string())?;
                // Checkpoint every other step.
                let ckpt = (step % 2 == 0).then_some(scratch.path());
                ctx.report([("loss", f64::from(step))], ckpt)?;
                if first_run && step == 3 {
                    // SAFETY: signalling our own process, as Ctrl-C would.
                    unsafe {
                        libc::kill(libc::getpid(), libc::SIGINT);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
            }
            Ok(())
        })
    };
    let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
    let tune = TuneConfig { metric: Some("loss".into()), mode: Some(Mode::Min), num_samples: 1, seed: Some(1), ..Default::default() };
    let t = Tuner::new(make(Arc::clone(&runs), Arc::clone(&starts)), space).tune_config(tune).run_config(RunConfig {
        name: "r".into(),
        storage: dir.path().into(),
        stop: Stop::new(),
        progress: ProgressMode::Quiet,
        ..Default::default()
    });
    let exp = t.experiment_dir();
    let err = t.fit().unwrap_err();
    assert!(matches!(err, TuneError::Interrupted(_)), "{err}");

    let grid = tuner::ResultGrid::load(&exp).unwrap();
    let trial = grid.get("trial_00000").unwrap();
    assert_eq!(trial.status.as_str(), "PENDING", "an interrupted trial is resumable");
    assert_eq!(trial.history.len(), 4, "step 4 was reported and answered Stop");
    assert!(trial.checkpoint().unwrap().ends_with("checkpoint_000004"));

    let grid =
        Tuner::restore(&exp, Some(make(Arc::clone(&runs), Arc::clone(&starts)))).unwrap().progress(ProgressMode::Quiet).fit().unwrap();
    let trial = grid.get("trial_00000").unwrap();
    assert_eq!(trial.status.as_str(), "TERMINATED");
    assert_eq!(*starts.lock().unwrap(), [0, 4], "the second run started from the step-4 checkpoint");
    let iters: Vec<u64> = trial.history.iter().map(|r| r.training_iteration).collect();
    assert_eq!(iters, [1, 2, 3, 4, 5, 6]);
    assert_eq!(trial.restarts, 1);
    assert_eq!(trial.checkpoints.iter().map(|c| c.iteration).collect::<Vec<_>>(), [2, 4, 6]);
    // Restoring a finished experiment runs nothing more.
    let again =
        Tuner::restore(&exp, Some(make(Arc::clone(&runs), Arc::clone(&starts)))).unwrap().progress(ProgressMode::Quiet).fit().unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // A function experiment cannot be restored without its function.
    assert!(matches!(Tuner::restore(&exp, None).unwrap().fit(), Err(TuneError::NoTrainer)));
}

/// A driver killed before the sweep's first group commit leaves its
/// experiment.toml and a store holding nothing (sled's unflushed buffers
/// die with the process; at most its files exist): nothing of that sweep
/// was ever acknowledged. A new run takes the directory, and a restore
/// begins the sweep anew from its file, seed included; a store that holds
/// an experiment is still refused to a new run.
#[test]
fn a_sweep_stopped_before_its_first_commit_begins_anew() {
    let dir = tempfile::tempdir().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let make = |runs: Arc<AtomicUsize>| {
        Trainable::function(move |ctx| {
            runs.fetch_add(1, Ordering::SeqCst);
            let x: f64 = ctx.param("x")?;
            ctx.report([("loss", x)], None)?;
            Ok(())
        })
    };
    let space = || Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
    let tune = TuneConfig { metric: Some("loss".into()), mode: Some(Mode::Min), num_samples: 3, seed: Some(7), ..Default::default() };
    let run = || RunConfig { name: "early".into(), storage: dir.path().into(), progress: ProgressMode::Quiet, ..Default::default() };
    let tuner = |runs: &Arc<AtomicUsize>| Tuner::new(make(Arc::clone(runs)), space()).tune_config(tune.clone()).run_config(run());
    let first = tuner(&runs).fit().unwrap();
    let exp = tuner(&runs).experiment_dir();
    let configs = |g: &tuner::ResultGrid| g.iter().map(|t| t.config["x"].as_f64().unwrap()).collect::<Vec<_>>();
    let planned = configs(&first);
    assert_eq!(first.len(), 3);

    // What a kill before the first commit leaves: sled's files, no experiment in them.
    let empty_store = || {
        std::fs::remove_dir_all(exp.join("store")).unwrap();
        drop(tuner::store::Store::open(&exp.join("store")).unwrap());
    };
    empty_store();
    let again = Tuner::restore(&exp, Some(make(Arc::clone(&runs)))).unwrap().progress(ProgressMode::Quiet).fit().unwrap();
    assert_eq!(again.len(), 3, "the restore ran the whole sweep anew");
    assert!(again.iter().all(|t| t.status.as_str() == "TERMINATED"));
    assert_eq!(configs(&again), planned, "from the file it was written with: the same seed, the same configs");
    assert_eq!(runs.load(Ordering::SeqCst), 6);

    // Not even sled's files: a new run takes the directory.
    std::fs::remove_dir_all(exp.join("store")).unwrap();
    std::fs::create_dir(exp.join("store")).unwrap();
    let anew = tuner(&runs).fit().unwrap();
    assert_eq!(anew.len(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 9);

    // A store that holds an experiment is another matter: refused, left as it was.
    let refused = tuner(&runs).fit().unwrap_err();
    assert!(matches!(refused, TuneError::Exists(_)), "{refused}");
    assert_eq!(tuner::ResultGrid::load(&exp).unwrap().len(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 9);

    // So is one without an experiment that holds anything else: no crash leaves that.
    std::fs::remove_dir_all(exp.join("store")).unwrap();
    let odd = tuner::store::Store::open(&exp.join("store")).unwrap();
    odd.put_trial(&tuner::store::TrialRecord::new("trial_00000".into(), 0, serde_json::json!({"x": 0.5}), 0.0)).unwrap();
    odd.flush().unwrap();
    drop(odd);
    let refused = tuner(&runs).fit().unwrap_err();
    assert!(matches!(refused, TuneError::Exists(_)), "{refused}");
    let refused = Tuner::restore(&exp, Some(make(Arc::clone(&runs)))).map(|_| ()).unwrap_err();
    assert!(refused.to_string().contains("holds no experiment"), "{refused}");
    assert!(tuner::store::Store::open_existing(&exp.join("store")).unwrap().trial("trial_00000").unwrap().is_some(), "left as it was");
    assert_eq!(runs.load(Ordering::SeqCst), 9);
}
