//! The examples, run for real: the quickstart (in-process trials) and
//! `wine.toml` through the `nestor` binary (worker processes).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_wine-worker")).parent().unwrap().to_path_buf()
}

#[test]
fn quickstart_prints_the_best_config_and_its_checkpoint() {
    let exe = bin_dir().join("examples/quickstart");
    assert!(exe.exists(), "{} is missing: cargo test builds the examples", exe.display());
    let dir = tempfile::tempdir().unwrap();
    let out =
        Command::new(exe).args(["--trials", "4", "--epochs", "6", "--storage"]).arg(dir.path()).args(["--name", "qs"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("4 trials: 4 terminated, 0 errors"), "{stdout}");
    let rmse: f64 = stdout.lines().find_map(|l| l.trim().strip_prefix("val_rmse:")).unwrap().trim().parse().unwrap();
    // Quality scores are 3..8; predicting the mean gives an RMSE near 0.8, and
    // a trained network does better.
    assert!(rmse > 0.3 && rmse < 0.9, "val_rmse {rmse}");
    let ckpt = stdout.lines().find_map(|l| l.trim().strip_prefix("checkpoint:")).unwrap().trim();
    assert!(ckpt.ends_with("checkpoint_000006"), "{ckpt}");
    assert!(Path::new(ckpt).join("rank-0/model.safetensors").is_file());
}

#[test]
fn wine_toml_runs_through_nestor_with_worker_processes() {
    let nestor = bin_dir().join("nestor");
    assert!(nestor.exists(), "{} is missing: cargo test --workspace builds it", nestor.display());
    let dir = tempfile::tempdir().unwrap();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let worker = format!("trainer.command=[{:?}]", env!("CARGO_BIN_EXE_wine-worker"));
    let out = Command::new(&nestor)
        .arg("run")
        .arg(manifest.join("wine.toml"))
        .args(["--storage"])
        .arg(dir.path())
        .args([
            "--set",
            "experiment.num_samples=3",
            "--set",
            "space.epochs=4",
            "--set",
            "stop.training_iteration=4",
            "--set",
            "space.lr=0.01",
            "--set",
            &worker,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let best = Command::new(&nestor).arg("best").arg(dir.path().join("wine-toml")).arg("--json").output().unwrap();
    let best: serde_json::Value = serde_json::from_slice(&best.stdout).unwrap();
    assert!(best["trial_id"].as_str().unwrap().starts_with("trial_"));
    assert_eq!(best["metrics"]["training_iteration"], 4.0);
    assert!(best["metrics"]["val_rmse"].as_f64().unwrap() < 1.0, "{best}");
    assert_eq!(best["config"]["lr"], 0.01);
    assert!(best["config"]["lr"].is_number());
    let ckpt = best["checkpoint"].as_str().unwrap();
    assert!(Path::new(ckpt).join("rank-0/model.safetensors").is_file(), "{ckpt}");
}

/// Two data-parallel workers, each on half of every batch with gradients
/// summed by `all_reduce`, train the same model as one worker on the whole
/// batch: the same validation RMSE at every epoch, up to float rounding.
#[test]
fn two_data_parallel_workers_match_one_worker_on_the_same_global_batch() {
    let data = std::sync::Arc::new(nestor_examples::WineData::load().unwrap());
    let storage = tempfile::tempdir().unwrap();
    let config = serde_json::json!({ "lr": 0.01, "hidden": 16, "batch_size": 64, "weight_decay": 0.001, "epochs": 8 });
    let run = |workers: u32| {
        let data = std::sync::Arc::clone(&data);
        trainer::Trainer::function(move |ctx| nestor_examples::train(ctx, &data))
            .scaling(trainer::ScalingConfig::workers(workers))
            .resources(trainer::NodeResources::declared(4.0))
            .config(config.clone())
            .storage(storage.path())
            .name(format!("w{workers}"))
            .fit()
            .unwrap()
    };
    let (one, two) = (run(1), run(2));
    assert_eq!(one.history.len(), 8);
    assert_eq!(two.history.len(), 8);
    let first = one.history[0].metrics["val_rmse"];
    let last = one.history[7].metrics["val_rmse"];
    assert!(last < first, "the model learns: {first} -> {last}");
    for (a, b) in one.history.iter().zip(&two.history) {
        let (x, y) = (a.metrics["val_rmse"], b.metrics["val_rmse"]);
        assert!((x - y).abs() < 1e-4 * x.max(1.0), "epoch {}: 1 worker {x}, 2 workers {y}", a.training_iteration);
    }
    // A different split of the work, not the same computation twice: the 2-worker run's checkpoint resumes on 1 worker.
    let resumed = {
        let data = std::sync::Arc::clone(&data);
        trainer::Trainer::function(move |ctx| nestor_examples::train(ctx, &data))
            .config(serde_json::json!({ "lr": 0.01, "hidden": 16, "batch_size": 64, "weight_decay": 0.001, "epochs": 10 }))
            .resources(trainer::NodeResources::declared(4.0))
            .storage(storage.path())
            .name("resumed")
            .resume_from_checkpoint(two.checkpoint.clone().unwrap())
            .fit()
            .unwrap()
    };
    assert_eq!(resumed.history.iter().map(|s| s.training_iteration).collect::<Vec<_>>(), [9, 10]);
}

/// A `Trainer` inside a sweep: every trial is a 2-worker run.
#[test]
fn a_trainer_runs_inside_a_sweep() {
    let data = std::sync::Arc::new(nestor_examples::WineData::load().unwrap());
    let storage = tempfile::tempdir().unwrap();
    let trainer = trainer::Trainer::function(move |ctx| {
        assert_eq!(ctx.world_size(), 2);
        nestor_examples::train(ctx, &data)
    })
    .scaling(trainer::ScalingConfig::workers(2));
    let grid = tuner::Tuner::new(trainer.into(), nestor_examples::space(3))
        .tune_config(tuner::TuneConfig {
            metric: Some("val_rmse".into()),
            mode: Some(tuner::Mode::Min),
            num_samples: 3,
            seed: Some(5),
            ..Default::default()
        })
        .run_config(tuner::RunConfig {
            name: "in-sweep".into(),
            storage: storage.path().into(),
            progress: tuner::ProgressMode::Quiet,
            ..Default::default()
        })
        .resources(trainer::NodeResources::declared(4.0))
        .fit()
        .unwrap();
    assert_eq!(grid.num_terminated(), 3);
    for t in grid.iter() {
        assert_eq!(t.history.len(), 3, "{}", t.trial_id);
    }
}

/// The quickstart with every scheduler: each ends every trial, and a trial
/// that was paused resumes from its checkpoint at the iteration after it
/// (its iterations run 1, 2, ... with none run twice and none skipped).
#[test]
fn quickstart_runs_with_every_scheduler_and_paused_trials_resume_from_their_checkpoints() {
    let exe = bin_dir().join("examples/quickstart");
    let dir = tempfile::tempdir().unwrap();
    for scheduler in ["asha", "asha-promotion", "hyperband", "bohb", "median", "fifo"] {
        let out = Command::new(&exe)
            .args(["--trials", "9", "--epochs", "9", "--workers", "1", "--scheduler", scheduler, "--storage"])
            .arg(dir.path())
            .args(["--name", scheduler])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{scheduler}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("9 trials: 9 terminated, 0 errors"), "{scheduler}: {stdout}");
        let exp = dir.path().join(scheduler);
        let grid = tuner::ResultGrid::load(&exp).unwrap();
        let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
        for (id, results) in store.all_results().unwrap() {
            let its: Vec<u64> = results.iter().map(|r| r.training_iteration).collect();
            assert_eq!(its, (1..=its.len() as u64).collect::<Vec<_>>(), "{scheduler} {id}");
        }
        let lengths: Vec<usize> = grid.iter().map(|t| t.history.len()).collect();
        let resumes: u32 = grid.iter().map(|t| t.resumes).sum();
        match scheduler {
            "fifo" => assert!(lengths.iter().all(|&n| n == 9), "{lengths:?}"),
            // Rungs at 1 and 3 (rf 3, max_t 9): most trials stop at the first.
            "asha" | "median" => {
                assert!(lengths.iter().any(|&n| n < 9), "{scheduler} stopped nothing early: {lengths:?}");
                assert_eq!(resumes, 0);
            }
            _ => {
                assert!(lengths.iter().any(|&n| n < 9) && lengths.contains(&9), "{scheduler}: {lengths:?}");
                assert!(resumes > 0, "{scheduler} resumed no paused trial");
                // A trial that resumed went past a rung (1 or 3) it had paused at.
                for t in grid.iter().filter(|t| t.resumes > 0) {
                    assert!(t.history.len() > 1, "{scheduler} {}: {:?}", t.trial_id, t.history.len());
                }
            }
        }
    }
}

/// `wine.toml` (worker processes) with each scheduler from TOML: every
/// trial ends, and paused trials resume from their checkpoints at the epoch
/// after the one they paused at.
#[test]
fn wine_toml_runs_with_each_scheduler_and_paused_workers_resume_from_checkpoints() {
    let nestor = bin_dir().join("nestor");
    let dir = tempfile::tempdir().unwrap();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let worker = format!("trainer.command=[{:?}]", env!("CARGO_BIN_EXE_wine-worker"));
    let schedulers: [(&str, &[&str]); 4] = [
        ("asha", &["scheduler.max_t=6"]),
        ("promotion", &["scheduler.max_t=6", "scheduler.asha_type=\"promotion\""]),
        ("hyperband", &["scheduler={ type = \"hyperband\", max_t = 6, reduction_factor = 2 }"]),
        ("median", &["scheduler={ type = \"median_stopping\", min_samples_required = 1 }"]),
    ];
    for (name, sets) in schedulers {
        let exp_name = format!("experiment.name=\"{name}\"");
        let mut args: Vec<&str> =
            vec!["experiment.num_samples=8", "space.epochs=6", "stop.training_iteration=6", "checkpoint.frequency=1", &worker, &exp_name];
        args.extend(sets);
        let mut cmd = Command::new(&nestor);
        cmd.arg("run").arg(manifest.join("wine.toml")).arg("--storage").arg(dir.path());
        for a in args {
            cmd.args(["--set", a]);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("8 trials (8 TERMINATED)"), "{name}: {stdout}");
        let exp = dir.path().join(name);
        let grid = tuner::ResultGrid::load(&exp).unwrap();
        assert!(grid.iter().any(|t| t.history.len() < 6), "{name} stopped no trial early");
        let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
        for (id, results) in store.all_results().unwrap() {
            let its: Vec<u64> = results.iter().map(|r| r.training_iteration).collect();
            assert_eq!(its, (1..=its.len() as u64).collect::<Vec<_>>(), "{name} {id}: an epoch ran twice or was skipped");
        }
        if name == "hyperband" {
            assert!(grid.iter().any(|t| t.resumes > 0), "{name}: no paused trial resumed");
        }
    }
}

/// The quickstart with PBT and PB2, perturbing every epoch: every trial ends; each
/// exploit's copy holds exactly the donor's weights, the recipient's next
/// epoch is the one after the donor's, and the explored values stay in
/// their domains.
#[test]
fn quickstart_with_pbt_and_pb2_copies_the_donors_weights_into_the_recipient() {
    for scheduler in ["pbt", "pb2"] {
        quickstart_population(scheduler);
    }
}

fn quickstart_population(scheduler: &str) {
    let exe = bin_dir().join("examples/quickstart");
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(&exe)
        .args(["--trials", "8", "--epochs", "12", "--workers", "1", "--scheduler", scheduler, "--storage"])
        .arg(dir.path())
        .args(["--name", "pbt"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("8 trials: 8 terminated, 0 errors"), "{stdout}");
    let exp = dir.path().join("pbt");
    let grid = tuner::ResultGrid::load(&exp).unwrap();
    assert!(!grid.exploits.is_empty(), "no exploit in 12 perturbation intervals");
    let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
    let results = store.all_results().unwrap();
    let weights = |ckpt: &str| std::fs::read(Path::new(ckpt).join("rank-0/model.safetensors")).unwrap();
    let mut compared = 0;
    for e in &grid.exploits {
        // Epochs run on from the donor's: the recipient's first result after the exploit.
        let at = |r: &search::TrialResult| r.metrics["timestamp"];
        let next = results[&e.trial_id].iter().find(|r| at(r) > e.at).expect("a result after the exploit");
        assert_eq!(next.training_iteration, e.donor_iteration + 1, "{e:?}");
        for key in ["lr", "weight_decay"] {
            let v = e.new_config[key].as_f64().unwrap();
            assert!(v > 0.0 && v <= 0.1, "{key} = {v}: {e:?}");
        }
        assert_eq!(e.new_config["epochs"], e.old_config["epochs"]);
        // Same weights, unless a later exploit of either trial replaced one of the two since.
        let replaced = grid
            .exploits
            .iter()
            .any(|l| l.at > e.at && (l.trial_id == e.trial_id || l.trial_id == e.donor) && l.donor_iteration <= e.donor_iteration);
        if !replaced {
            assert_eq!(weights(&e.checkpoint), weights(&e.donor_checkpoint), "{e:?}");
            compared += 1;
        }
    }
    assert!(compared > 0, "every exploit's copy was replaced later");
}

#[test]
fn the_readmes_rust_sweep_runs() {
    let exe = bin_dir().join("examples/sweep");
    assert!(exe.exists(), "{} is missing: cargo test builds the examples", exe.display());
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(exe).current_dir(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // `{"lr":...} Some({"loss": L, ...}) ...`: the best lr is near 0.01, its loss just over 1/20.
    let loss: f64 = stdout.split("\"loss\": ").nth(1).unwrap().split([',', '}']).next().unwrap().parse().unwrap();
    assert!((0.05..0.06).contains(&loss), "{stdout}");
    assert_eq!(std::fs::read_dir(dir.path().join("nestor-runs")).unwrap().count(), 1);
}

/// Runs the example `name` in a new directory; its standard output.
fn run_example(name: &str, dir: &Path) -> String {
    let exe = bin_dir().join("examples").join(name);
    assert!(exe.exists(), "{} is missing: cargo test builds the examples", exe.display());
    let out = Command::new(exe).current_dir(dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn the_docs_rust_sweep_runs() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = run_example("docs-sweep", dir.path());
    // `trial_000NN {"batch_size":..,"lr":..,"model":{"width":..}} None`: the best has the largest lr.
    assert!(stdout.starts_with("trial_000"), "{stdout}");
    let config: serde_json::Value = serde_json::from_str(stdout.split_once(' ').unwrap().1.rsplit_once(' ').unwrap().0).unwrap();
    let width = config["model"]["width"].as_u64().unwrap();
    assert!(config["lr"].as_f64().unwrap() > 1e-3 && (64..=512).contains(&width) && width / 64 * 64 == width, "{stdout}");
    assert!(dir.path().join("nestor-runs/my-sweep/store").is_dir());
}

#[test]
fn the_docs_one_run_averages_its_ranks_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = run_example("docs-one-run", dir.path());
    let w: f64 = stdout.strip_prefix("w = ").unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!((w - 3.5).abs() < 1e-3, "2 ranks' targets 3 and 4 average 3.5: {stdout}");
    assert!(stdout.contains("after 100 steps"), "{stdout}");
}

#[test]
fn the_docs_worker_runs_under_nestor() {
    let nestor = bin_dir().join("nestor");
    assert!(nestor.exists(), "{} is missing: cargo test --workspace builds it", nestor.display());
    let dir = tempfile::tempdir().unwrap();
    let worker = bin_dir().join("examples/docs-worker");
    std::fs::write(
        dir.path().join("sweep.toml"),
        format!(
            "[experiment]\nname = \"docs-worker\"\nmetric = \"loss\"\nmode = \"min\"\n\n[space]\nlr = {{ grid = [0.1, 0.3] }}\n\n\
             [trainer]\ncommand = [{:?}]\nnum_workers = 2\n",
            worker.display().to_string()
        ),
    )
    .unwrap();
    let out = Command::new(&nestor).args(["run", "sweep.toml", "--plain"]).current_dir(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("2 trials (2 TERMINATED)"), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let best = Command::new(&nestor).args(["best", "nestor-runs/docs-worker", "--json"]).current_dir(dir.path()).output().unwrap();
    let best: serde_json::Value = serde_json::from_slice(&best.stdout).unwrap();
    // lr 0.3: w = 3 (1 - 0.4^10), its loss 9 * 0.4^20.
    assert!((best["metrics"]["loss"].as_f64().unwrap() - 9.0 * 0.4f64.powi(20)).abs() < 1e-9, "{best}");
    assert!(best["checkpoint"].as_str().is_some_and(|c| Path::new(c).join("rank-0/w").is_file()), "{best}");
}
