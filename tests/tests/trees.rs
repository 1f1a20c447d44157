//! Gradient-boosted trees across the ranks of a trial, with the real
//! frameworks (xgboost-cpu, lightgbm) on scikit-learn's bundled data:
//! `XGBoostTrainer` and `LightGBMTrainer` on the `Backend` seam.

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
