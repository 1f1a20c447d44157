//! The `[datasets]` example end to end: Parquet written, planned by the
//! sweep, each rank reading half of the training rows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn the_data_example_tunes_with_each_rank_reading_half_the_training_rows() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let out = Command::new(env!("CARGO_BIN_EXE_wine-data"))
        .args(["--trials", "4", "--epochs", "6", "--storage", storage.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let line = |key: &str| stdout.lines().find_map(|l| l.trim().strip_prefix(key)).unwrap_or_else(|| panic!("no {key} in {stdout}")).trim();
    assert_eq!(line("4 trials:").split(" in ").next(), Some("4 terminated, 0 errors"));
    // 1,279 training rows over 2 ranks: 639 each, the one left over moving on each epoch.
    assert_eq!(line("rows:"), "639 training rows a rank an epoch");
    let rmse: f64 = line("val_rmse:").parse().unwrap();
    assert!(rmse < 0.8, "a linear model of wine quality reaches an RMSE below 0.8, not {rmse}");
    let checkpoint = std::path::PathBuf::from(line("checkpoint:"));
    assert!(checkpoint.join("rank-0/weights.json").is_file(), "{}", checkpoint.display());
    // The plan the ranks read: 4 files of 4 row groups, and the validation file.
    let exp = checkpoint.parent().unwrap().parent().unwrap().parent().unwrap();
    let plan: serde_json::Value = serde_json::from_slice(&std::fs::read(exp.join("datasets.json")).unwrap()).unwrap();
    let blocks = |name: &str| plan["datasets"][name]["blocks"].as_array().unwrap().len();
    assert_eq!((blocks("train"), blocks("valid")), (16, 4));
    assert_eq!(plan["datasets"]["train"]["shuffle"], true);
    assert_eq!(plan["datasets"]["valid"]["split"], false);
}
