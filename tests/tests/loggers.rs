//! Loggers, read back by their own tools: TensorBoard's event accumulator
//! over the event files a sweep of real worker processes wrote. The tools
//! come from a cached environment (tests/loggers-venv.sh).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::*;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The cached environment with tensorboard, mlflow and wandb.
fn loggers_venv() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let out = Command::new("bash").arg(repo().join("tests/loggers-venv.sh")).output().expect("run loggers-venv.sh");
        assert!(out.status.success(), "tests/loggers-venv.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
    .clone()
}

/// Runs `code` with the loggers' Python; its stdout parsed as JSON.
fn python_json(code: &str, args: &[&str]) -> Value {
    let out = Command::new(loggers_venv().join("bin/python")).arg("-c").arg(code).args(args).output().expect("run python");
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// TensorBoard's own reader: per run directory below the log dir, every
/// scalar tag's points, and the hparams of its last session start.
const READ_TENSORBOARD: &str = r#"
import json, os, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
out = {}
for trial in sorted(os.listdir(sys.argv[1])):
    ea = EventAccumulator(os.path.join(sys.argv[1], trial), size_guidance={"scalars": 0})
    ea.Reload()
    scalars = {t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}
    hp = {}
    ends = []
    for tag, content in ea.PluginTagToContent("hparams").items():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            for k, v in data.session_start_info.hparams.items():
                hp[k] = v.number_value if v.HasField("number_value") else v.string_value
        if data.HasField("session_end_info"):
            ends.append(data.session_end_info.status)
    out[trial] = {"scalars": scalars, "hparams": hp, "ends": ends}
print(json.dumps(out))
"#;

#[test]
fn tensorboard_reads_every_point_the_store_holds() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "\n[failure]\nmax_failures = 1\n\n[[callbacks]]\ntype = \"tensorboard\"\ndir = \"tb\"\n";
    write(
        dir.path(),
        &sweep(
            "tb",
            "num_samples = 4\nmax_concurrent_trials = 2\nseed = 5",
            "x = { uniform = [0.0, 1.0] }\nsteps = 6\ncheckpoint = true\nfail_at = { grid = [100, 4] }",
            extra,
        ),
    );
    let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("restarting from checkpoint_000003"), "{stderr}");
    let rows = export(dir.path(), "runs/tb");
    let tb = python_json(READ_TENSORBOARD, &[&dir.path().join("runs/tb/tb").display().to_string()]);
    let trials: BTreeMap<String, Vec<&Value>> = rows.iter().fold(BTreeMap::new(), |mut m, r| {
        m.entry(r["trial_id"].as_str().unwrap().to_string()).or_default().push(r);
        m
    });
    assert_eq!(tb.as_object().unwrap().len(), trials.len(), "a run per trial: {tb}");
    assert_eq!(trials.len(), 8);
    let mut failed = 0;
    for (trial, results) in &trials {
        let run = &tb[trial.as_str()];
        // Every stored point of every metric is in TensorBoard, at its iteration.
        for metric in ["loss", "acc", "time_total_s", "time_this_iter_s"] {
            let points: Vec<(u64, f64)> =
                run["scalars"][metric].as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap())).collect();
            assert_eq!(points.len(), results.len(), "{trial} {metric}: {points:?}");
            for (r, (step, value)) in results.iter().zip(&points) {
                assert_eq!(r["training_iteration"].as_u64(), Some(*step));
                let stored = r[metric].as_f64().unwrap();
                assert!((stored as f32 as f64 - value).abs() <= 1e-6 * stored.abs().max(1.0), "{trial} {metric}: {stored} vs {value}");
            }
        }
        assert!(run["scalars"].get("training_iteration").is_none() && run["scalars"].get("timestamp").is_none());
        // The config as hparams, and how the trial ended.
        assert_eq!(run["hparams"]["x"].as_f64(), results[0]["config"]["x"].as_f64(), "{run}");
        let fail_at = results[0]["config"]["fail_at"].as_u64().unwrap();
        if fail_at == 4 {
            failed += 1;
            // Its first run reports 1-3 and fails at 4; the second, from checkpoint 3, fails at 4 again.
            assert_eq!(results.len(), 3, "{trial}");
            assert_eq!(run["ends"], serde_json::json!([2]), "STATUS_FAILURE: {run}");
        } else {
            assert_eq!(results.len(), 6);
            assert_eq!(run["ends"], serde_json::json!([1]), "STATUS_SUCCESS: {run}");
        }
    }
    assert_eq!(failed, 4);
}
