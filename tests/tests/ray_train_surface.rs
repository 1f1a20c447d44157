//! Ray Train's own surface, run for real with imports changed: Ray Data's
//! training surface (tests/py/ray_data_train.py: the transforms guide,
//! preprocessors saved in metadata, the XGBoost quickstart's
//! `materialize().to_pandas()`, LightGBMTrainer's older form, a custom
//! `DataConfig`, text, NumPy and image files) and the behaviours where
//! nestor once differed from Ray without saying so (tests/py/ray_silent.py).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::python::{line, passed, torch_python};
use serde_json::Value;

fn scenario(script: &str, name: &str) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    std::fs::create_dir_all(&storage).unwrap();
    let out = torch_python(dir.path(), script, &[storage.to_str().unwrap(), name], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = passed(out);
    (serde_json::from_str(line(&stdout, "OUT")).unwrap(), stderr)
}

#[test]
fn row_transforms_and_a_fitted_preprocessor_reach_each_rank_as_the_driver_computes_them() {
    let (got, _) = scenario("tests/py/ray_data_train.py", "transforms");
    // filter kept the "b" rows (2 in 3 of 600); each rank reads half, every row read once an epoch.
    assert_eq!(got["expected_rows"], 400, "{got}");
    for rank in ["rank-0.json", "rank-1.json"] {
        assert_eq!(got["share_rows"][rank], serde_json::json!([200, 200]), "{got}");
    }
    assert_eq!(got["ids_per_epoch"], serde_json::json!([400, 400]), "the ranks' shares are disjoint and whole: {got}");
    assert_eq!(got["mismatched"], 0, "each rank's rows are the driver's (map, add_column, imputer, scaler, concatenator): {got}");
    assert_eq!(got["metadata_keys"], serde_json::json!([["preprocessor_pkl"], ["preprocessor_pkl"]]), "{got}");
    assert_eq!(got["restored_stats"], serde_json::json!(["mean(x1)", "mean(x2)", "std(x1)", "std(x2)"]), "{got}");
}

#[test]
fn the_xgboost_quickstart_materializes_each_ranks_share() {
    let (got, _) = scenario("tests/py/ray_data_train.py", "xgboost");
    assert_eq!(got["rounds"], 10, "{got}");
    assert!(got["validation-rmse"].as_f64().unwrap() < 1.0, "the model learnt y = 2 x1 + 1: {got}");
}

#[test]
fn a_tuner_over_an_older_form_xgboost_trainer_merges_the_trials_params_and_rounds() {
    let (got, _) = scenario("tests/py/ray_data_train.py", "xgboost-tuned");
    let trials = got["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4, "2 rounds x 2 worker counts: {got}");
    for t in trials {
        assert_eq!(t["error"], Value::Null, "{got}");
        assert_eq!(t["rounds"], t["asked"], "the trial's num_boost_round, not the trainer's 10: {got}");
        assert!(t["depth"].as_u64().unwrap() <= t["asked_depth"].as_u64().unwrap(), "the trial's max_depth, not the trainer's 4: {got}");
    }
}

#[test]
fn prepare_trainer_feeds_a_hugging_face_trainer_each_ranks_share() {
    let (got, _) = scenario("tests/py/ray_data_train.py", "huggingface");
    assert_eq!(got["steps"], 20.0, "max_steps of 8 rows a step: {got}");
    assert_eq!(got["checkpoint"], true, "{got}");
    // 20 steps of 8 rows: each rank's 128-row share once, then 32 rows of its next epoch.
    assert_eq!(got["rows"], serde_json::json!({"rank-0.json": 160, "rank-1.json": 160}), "{got}");
    assert_eq!(got["overlap"], 0, "no row reached both ranks: {got}");
    assert_eq!(got["distinct"], 256, "every row reached a rank: {got}");
}

#[test]
fn lightgbm_trainer_takes_rays_older_params_label_column_datasets_form() {
    let (got, _) = scenario("tests/py/ray_data_train.py", "lightgbm");
    assert_eq!(got["rounds"], 8, "{got}");
    assert_eq!(got["iterations"], 8, "a report a round: {got}");
    assert_eq!(got["metrics"], serde_json::json!(["train-l2", "valid-l2"]), "{got}");
}

#[test]
fn a_custom_data_config_and_text_numpy_and_image_files_feed_the_ranks() {
    let (got, _) = scenario("tests/py/ray_data_train.py", "ingest");
    for rank in ["rank-0.json", "rank-1.json"] {
        assert_eq!(got["custom"][rank]["lines"], 20, "configure's equal split of 40 lines: {got}");
        assert_eq!(got["custom"][rank]["lookup"], 5, "configure gave every rank the whole lookup: {got}");
        assert_eq!(got["plain"][rank]["arrays"], serde_json::json!([12, 2, 3]), "half of 24 arrays of 2 x 3: {got}");
        assert_eq!(got["plain"][rank]["images"], serde_json::json!([3, 4, 4]), "3 images each, resized, in L mode: {got}");
    }
    assert_eq!(got["all_lines"], true, "{got}");
    let values: Vec<Value> =
        ["rank-0.json", "rank-1.json"].iter().flat_map(|r| got["plain"][r]["image_values"].as_array().unwrap().clone()).collect();
    assert_eq!(values.len(), 6, "each image read by one rank: {got}");
}

#[test]
fn sweeps_of_one_trainable_started_in_the_same_second_get_names_of_their_own() {
    let (got, _) = scenario("tests/py/ray_silent.py", "same-second");
    assert_eq!(got["errors"], serde_json::json!([]), "{got}");
    let names: Vec<&str> = got["names"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(names.len(), 3, "{got}");
    assert_eq!(names.iter().collect::<std::collections::BTreeSet<_>>().len(), 3, "three directories: {got}");
    assert!(names.iter().all(|n| n.starts_with("objective_")), "Ray's <trainable>_<date> names: {got}");
}

#[test]
fn tuner_restore_expands_the_home_directory() {
    let (got, _) = scenario("tests/py/ray_silent.py", "restore-home");
    assert_eq!(got["trials"], 3, "{got}");
    assert!(got["path"].as_str().unwrap().ends_with("/runs/ray_results/home"), "{got}");
}

#[test]
fn fail_fast_returns_the_grid_and_fail_fast_raise_raises() {
    let (got, _) = scenario("tests/py/ray_silent.py", "fail-fast");
    assert_eq!(got["grid"]["trials"], 2, "the sweep stopped at the failed trial: {got}");
    assert_eq!(got["grid"]["errors"], 1, "{got}");
    assert!(got["grid"]["error"].as_str().unwrap().contains("trial with x=2 fails on purpose"), "{got}");
    assert!(got["raised"].as_str().unwrap().starts_with("fail_fast: trial_00001"), "{got}");
}

#[test]
fn a_train_functions_return_value_is_not_a_result() {
    let (got, _) = scenario("tests/py/ray_silent.py", "train-return");
    assert_eq!(got["iterations"], 3, "{got}");
    assert!((got["loss"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9, "the last report's, not the returned 999: {got}");
}

#[test]
fn a_checkpoint_dir_name_is_found_under_the_experiments_directory() {
    let (got, _) = scenario("tests/py/ray_silent.py", "dir-name");
    assert_eq!(got["found"], serde_json::json!({"0": "epoch 0", "1": "epoch 1"}), "{got}");
}

#[test]
fn the_ranks_prints_reach_the_drivers_console_behind_their_rank_unless_turned_off() {
    let (_, stderr) = scenario("tests/py/ray_silent.py", "echo");
    for rank in 0..2 {
        assert!(stderr.contains(&format!("(trial_00000 rank {rank}) hello from rank {rank}\n")), "{stderr}");
    }
    let (_, stderr) = scenario("tests/py/ray_silent.py", "quiet");
    assert!(!stderr.contains("hello from rank"), "log_to_driver=False keeps them in the rank logs: {stderr}");
}

#[test]
fn a_user_callback_gets_every_ranks_metrics_of_each_report() {
    let (got, _) = scenario("tests/py/ray_silent.py", "user-callback");
    let seen = got["seen"].as_array().unwrap();
    assert_eq!(seen.len(), 3, "one call a report: {got}");
    for (step, metrics) in seen.iter().enumerate() {
        let ranks: Vec<f64> = metrics.as_array().unwrap().iter().map(|m| m["rank"].as_f64().unwrap()).collect();
        assert_eq!(ranks, vec![0.0, 1.0], "rank 0's first, then rank 1's: {got}");
        let loss = metrics[1]["loss"].as_f64().unwrap();
        assert!((loss - (1.0 + step as f64 / 10.0)).abs() < 1e-9, "rank 1's own value: {got}");
    }
}
