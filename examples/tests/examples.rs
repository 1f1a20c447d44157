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
