//! Gradient-boosted trees and Keras across the ranks of a trial, with the
//! real frameworks (xgboost-cpu, lightgbm, TensorFlow with Keras 2) on
//! scikit-learn's bundled data: `XGBoostTrainer`, `LightGBMTrainer` and
//! `TensorflowTrainer` on the `Backend` seam.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::data::rank_lines;
use common::python::*;

/// Runs tests/py/trees.py MODE on 2 ranks; its output, the ranks' first lines and the trial's record.
fn trees(mode: &str) -> (String, Vec<serde_json::Value>, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let out = passed(torch_python(dir.path(), "tests/py/trees.py", &[dir.path().to_str().unwrap(), mode], &[]));
    let run = dir.path().join("runs").join(mode);
    let lines = rank_lines(&run, 2).into_iter().filter_map(|rank| rank.into_iter().next()).collect();
    let trial = trials(dir.path(), &run).remove(0);
    (out, lines, trial)
}

fn rounds_reported(trial: &serde_json::Value) -> Vec<u64> {
    trial["history"].as_array().unwrap().iter().map(|r| r["training_iteration"].as_u64().unwrap()).collect()
}

#[test]
fn xgboost_ranks_train_one_booster_report_every_round_and_its_checkpoint_loads_in_xgboost() {
    let (out, ranks, trial) = trees("xgb");
    assert_eq!(ranks.len(), 2, "{out}");
    // Each rank boosts on its own half of the rows, and both hold the same trees: one model across the ranks.
    assert_ne!(ranks[0]["rows"], ranks[1]["rows"]);
    assert_eq!(ranks[0]["model"], ranks[1]["model"], "{ranks:?}");
    assert_eq!(ranks[0]["rounds"], 10);
    assert_eq!(rounds_reported(&trial), (1..=10).collect::<Vec<_>>(), "a result every round");
    assert_eq!(trial["checkpoints"].as_array().unwrap().len(), 2, "checkpoints at rounds 5 and 10: {trial}");
    assert_eq!(line(&out, "LOADED"), "10", "xgboost.Booster(model_file=...) loads the best checkpoint");
    assert!(line(&out, "METRIC").parse::<f64>().unwrap() < 0.2, "{out}");
}

#[test]
fn xgboosts_older_form_trains_on_the_trainers_data_sets_and_reports_their_metrics() {
    let (out, _, trial) = trees("xgb-legacy");
    assert_eq!(line(&out, "LOADED"), "8");
    let metrics: serde_json::Value = serde_json::from_str(line(&out, "METRICS")).unwrap();
    for k in ["train-logloss", "train-error", "valid-logloss", "valid-error"] {
        assert!(metrics[k].as_f64().is_some(), "{k} missing: {metrics}");
    }
    assert!(metrics["valid-error"].as_f64().unwrap() < 0.1, "{metrics}");
    assert!(rounds_reported(&trial).len() >= 8, "{trial}");
}

#[test]
fn lightgbm_ranks_form_one_network_and_train_one_booster_that_loads_in_lightgbm() {
    let (out, ranks, trial) = trees("lgb");
    assert_eq!(ranks.len(), 2, "{out}");
    assert_eq!(ranks[0]["model"], ranks[1]["model"], "{ranks:?}");
    let machines = ranks[0]["network"]["machines"].as_str().unwrap();
    assert_eq!(machines.split(',').count(), 2, "{machines}");
    for (r, rank) in ranks.iter().enumerate() {
        assert_eq!(rank["network"]["machines"], machines, "every rank has the same list");
        let port = rank["network"]["local_listen_port"].as_u64().unwrap();
        assert!(machines.split(',').nth(r).unwrap().ends_with(&format!(":{port}")), "rank {r} listens where the list says");
    }
    assert_eq!(rounds_reported(&trial), (1..=10).collect::<Vec<_>>());
    assert_eq!(line(&out, "LOADED"), "10", "lightgbm.Booster(model_file=...) loads the best checkpoint");
}

#[test]
fn the_xgboost_example_sweeps_under_asha_in_boosting_rounds_stopping_weak_trials_early() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("EXAMPLE_STORAGE", dir.path().join("runs").display().to_string())];
    let out = passed(torch_python(dir.path(), "examples/python/tune_xgboost.py", &[], &env));
    let rounds: Vec<u64> = serde_json::from_str(line(&out, "rounds per trial:")).unwrap();
    assert_eq!(rounds.len(), 8, "{out}");
    assert!(rounds.iter().any(|&r| r < 12), "ASHA stopped no trial early: {rounds:?}");
    assert!(rounds.contains(&12), "no trial boosted its 12 rounds: {rounds:?}");
    assert!(rounds.iter().all(|r| [2, 6, 12].contains(r)), "trials stop at ASHA's rungs (2, 6) or the end: {rounds:?}");
    let best = line(&out, "best booster:");
    let (n, reported) = (best.split(' ').next().unwrap(), best.rsplit('(').next().unwrap().trim_end_matches(')'));
    assert_eq!(n, reported, "the best checkpoint loads, with its trial's last round: {out}");
}

#[test]
fn an_xgboost_rank_killed_mid_trial_restarts_from_the_saved_booster_and_ends_as_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let env = [("SLOW_S", "0.25".to_string())];
    let mut run = torch_python_cmd(dir.path(), "tests/py/trees.py", &[root, "xgb-resume", "killed"], &env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let killed = dir.path().join("runs/killed");
    common::wait_for_run("checkpoint 4 committed", 120.0, &mut run, || {
        killed.join("trials/trial_00000/checkpoint_000004/.committed").exists()
    });
    let victim = u32::try_from(rank_lines(&killed, 2)[1][0]["pid"].as_u64().unwrap()).unwrap();
    common::signal(victim, libc::SIGKILL);
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    passed(torch_python(dir.path(), "tests/py/trees.py", &[root, "xgb-resume", "reference"], &[]));
    let (k, r) = (rank_lines(&killed, 2), rank_lines(&dir.path().join("runs/reference"), 2));
    for rank in 0..2 {
        let starts: Vec<u64> = k[rank].iter().filter_map(|l| l.get("start")).map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(starts.first(), Some(&0));
        assert!(starts.len() == 2 && starts[1] >= 4, "rank {rank}: the restart began from a saved booster: {starts:?}");
        let model = |lines: &[serde_json::Value]| lines.iter().rev().find_map(|l| l.get("model")).cloned();
        assert_eq!(model(&k[rank]), model(&r[rank]), "rank {rank}: the restarted trial ends with the uninterrupted run's booster");
    }
    let trial = trials(dir.path(), &killed).remove(0);
    assert_eq!(trial["status"], "TERMINATED", "{trial}");
    assert_eq!(rounds_reported(&trial).last(), Some(&10));
}

#[test]
fn lightgbm_ranks_on_two_slurm_nodes_form_one_network_across_them() {
    // Each node its own network namespace and address: the hub and the
    // machine list cross nodes as they would on a cluster.
    let dir = tempfile::tempdir().unwrap();
    let stdout = on_two_slurm_nodes("trees.py", dir.path(), &["lgb"]);
    let run = dir.path().join("runs/lgb");
    let trial = trials(dir.path(), &run).remove(0);
    assert_eq!(trial["nodes"], serde_json::json!(["node1", "node2"]), "{trial}");
    let ranks: Vec<serde_json::Value> = rank_lines(&run, 2).into_iter().filter_map(|r| r.into_iter().next()).collect();
    assert_eq!(ranks[0]["model"], ranks[1]["model"], "{ranks:?}");
    let machines = ranks[0]["network"]["machines"].as_str().unwrap().to_string();
    let hosts: std::collections::BTreeSet<&str> = machines.split(',').map(|m| m.rsplit_once(':').unwrap().0).collect();
    assert_eq!(hosts.len(), 2, "two nodes, two addresses: {machines}");
    assert_eq!(line(&stdout, "LOADED"), "10");
}

/// Runs tests/py/keras_mwms.py MODE; its output and the run's directory.
fn keras(mode: &str) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let out = passed(torch_python(dir.path(), "tests/py/keras_mwms.py", &[dir.path().to_str().unwrap(), mode], &[]));
    (out, dir)
}

#[test]
fn a_keras_model_under_multi_worker_mirrored_strategy_trains_one_set_of_weights_across_two_ranks() {
    let (out, dir) = keras("fit");
    let run = dir.path().join("runs/fit");
    let ranks: Vec<serde_json::Value> = rank_lines(&run, 2).into_iter().filter_map(|r| r.into_iter().next()).collect();
    assert_eq!(ranks.len(), 2, "{out}");
    for rank in &ranks {
        assert_eq!(rank["workers"], 2, "the strategy spans both ranks (TF_CONFIG): {rank}");
        assert_eq!(rank["rows"], 284, "each rank reads its half of the 569 rows (nestor.data's split): {rank}");
        assert_eq!(rank["epochs"], 4);
    }
    assert_eq!(ranks[0]["model"], ranks[1]["model"], "the ranks' weights agree: {ranks:?}");
    let trial = trials(dir.path(), &run).remove(0);
    assert_eq!(rounds_reported(&trial), vec![1, 2, 3, 4], "ReportCheckpointCallback reports every epoch: {trial}");
    assert_eq!(trial["checkpoints"].as_array().unwrap().len(), 4, "with a checkpoint each: {trial}");
    assert_eq!(line(&out, "LOADED"), ranks[0]["model"].as_str().unwrap(), "the checkpoint loads as the trained model");
    assert!(line(&out, "METRIC").parse::<f64>().unwrap() < 0.3, "{out}");
}

#[test]
fn asha_stops_weak_keras_trials_and_both_ranks_leave_fit_at_the_stopped_epoch() {
    let (out, dir) = keras("asha");
    let epochs: Vec<u64> = serde_json::from_str(line(&out, "EPOCHS")).unwrap();
    assert_eq!(epochs.len(), 4, "{out}");
    assert!(epochs.iter().any(|&e| e < 6), "ASHA stopped no trial early: {epochs:?}");
    assert!(epochs.contains(&6), "no trial ran its 6 epochs: {epochs:?}");
    let trials_dir = dir.path().join("runs/asha/trials");
    for entry in std::fs::read_dir(&trials_dir).unwrap() {
        let logs = entry.unwrap().path().join("logs");
        let mut ran = Vec::new();
        for r in 0..2 {
            let log = std::fs::read_to_string(logs.join(format!("rank-{r}.log"))).unwrap();
            assert!(!log.contains("Traceback"), "rank {r} ended with an error: {log}");
            let rank: serde_json::Value =
                serde_json::from_str(log.lines().find_map(|l| l.strip_prefix("RANK ")).expect("the rank left fit")).unwrap();
            ran.push((rank["epochs"].as_u64().unwrap(), rank["model"].clone()));
        }
        assert_eq!(ran[0], ran[1], "both ranks left fit at the same epoch with the same weights: {logs:?}");
        assert!(epochs.contains(&ran[0].0), "a rank's epochs are its trial's reports: {ran:?} {epochs:?}");
    }
    assert_eq!(line(&out, "LOADED").len(), 16, "the best checkpoint loads: {out}");
}

#[test]
fn the_xgboost_experiment_file_sweeps_2_rank_trials_under_asha_through_the_backend_hooks() {
    // examples/xgboost: the ranks are the experiment file's `command`, run in
    // XGBoostConfig's hooks by nestor.train.backend.run.
    let dir = tempfile::tempdir().unwrap();
    let path = format!("{}:{}", torch_venv().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let storage = dir.path().to_str().unwrap();
    let out = std::process::Command::new(common::nestor_bin())
        .args(["run", "examples/xgboost/sweep.toml", "--storage", storage, "--plain"])
        .current_dir(repo())
        .env("PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let exp = dir.path().join("xgboost");
    let trials = trials(dir.path(), &exp);
    assert_eq!(trials.len(), 12, "{stdout}");
    let rounds: Vec<u64> = trials.iter().map(|t| *rounds_reported(t).last().unwrap()).collect();
    assert!(rounds.iter().any(|&r| r < 30), "ASHA stopped no trial early: {rounds:?}");
    assert!(rounds.contains(&30), "no trial boosted its 30 rounds: {rounds:?}");
    for t in &trials {
        assert_eq!(t["status"], "TERMINATED", "{t}");
        let id = t["trial_id"].as_str().unwrap();
        let models: Vec<String> = (0..2)
            .map(|r| {
                let log = std::fs::read_to_string(exp.join(format!("trials/{id}/logs/rank-{r}.log"))).unwrap();
                log.lines().find_map(|l| l.strip_prefix("MODEL ")).unwrap_or_else(|| panic!("rank {r} of {id}: {log}")).to_string()
            })
            .collect();
        assert_eq!(models[0], models[1], "{id}: the ranks trained one booster");
    }
    let best: serde_json::Value = serde_json::from_slice(
        &std::process::Command::new(common::nestor_bin()).args(["best", exp.to_str().unwrap(), "--json"]).output().unwrap().stdout,
    )
    .unwrap();
    let model = std::path::Path::new(best["checkpoint"].as_str().unwrap()).join("rank-0/model.ubj");
    let check = format!("import xgboost; print(xgboost.Booster(model_file={:?}).num_boosted_rounds())", model.display().to_string());
    let loaded = std::process::Command::new(torch_venv().join("bin/python")).args(["-c", &check]).output().unwrap();
    let n: u64 = String::from_utf8_lossy(&loaded.stdout).trim().parse().unwrap_or_else(|_| panic!("{loaded:?}"));
    assert_eq!(n % 5, 0, "the best checkpoint is a booster saved every 5 rounds: {n}");
    assert!((5..=30).contains(&n), "{n}");
}

#[test]
fn ray_tunes_tree_callbacks_report_every_round_under_asha_for_train_cv_and_lightgbm() {
    // Function trainables with ray.tune.integration.{xgboost,lightgbm}'s
    // TuneReportCheckpointCallback: xgboost.train (a checkpoint every round,
    // a file name of its own), xgboost.cv (its folds folded by
    // results_postprocessing_fn, no checkpoint) and lightgbm.train.
    let dir = tempfile::tempdir().unwrap();
    let out = passed(torch_python(dir.path(), "tests/py/trees.py", &[dir.path().to_str().unwrap(), "tune-callbacks"], &[]));
    for name in ["xgb", "xgb-cv", "lgb"] {
        let summary: serde_json::Value = serde_json::from_str(line(&out, &format!("TUNE {name}"))).unwrap();
        assert_eq!(summary["errors"], 0, "{name}: {summary}");
        let iterations: Vec<u64> = summary["iterations"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap()).collect();
        assert_eq!(iterations.len(), 4, "{name}: {summary}");
        assert!(iterations.iter().any(|&i| i < 10), "{name}: ASHA stopped no trial early: {iterations:?}");
        assert!(iterations.contains(&10), "{name}: no trial ran its 10 rounds: {iterations:?}");
        assert!(summary["best"].as_f64().unwrap() < 0.3, "{name}: {summary}");
        if name == "xgb-cv" {
            assert_eq!(summary["checkpoint"], false, "xgboost.cv has no one booster to save: {summary}");
        } else {
            assert_eq!(summary["loaded"], summary["best_iteration"], "{name}: the best checkpoint loads with its round: {summary}");
        }
    }
}

#[test]
fn ray_tunes_keras_callback_reports_a_keras_3_function_trainable_under_asha() {
    let (out, dir) = keras("tune-fn");
    let epochs: Vec<u64> = serde_json::from_str(line(&out, "EPOCHS")).unwrap();
    assert_eq!(epochs.len(), 4, "{out}");
    assert!(epochs.iter().any(|&e| e < 6) && epochs.contains(&6), "ASHA in epochs: {epochs:?}");
    assert_eq!(line(&out, "ERRORS"), "0", "{out}");
    assert!(line(&out, "BEST").parse::<f64>().unwrap() > 0.9, "{out}");
    // The trials ran Keras 3 (no TensorflowTrainer set Keras 2 up), and the checkpoint loads with it.
    let trials = dir.path().join("runs/tune-fn/trials");
    for entry in std::fs::read_dir(&trials).unwrap() {
        let log = std::fs::read_to_string(entry.unwrap().path().join("logs/rank-0.log")).unwrap();
        assert!(log.lines().any(|l| l.starts_with("KERAS 3.")), "{log}");
    }
    assert!(line(&out, "LOADED").starts_with("keras "), "{out}");
}
