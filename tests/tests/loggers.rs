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

/// An MLflow tracking server on loopback, stopped when dropped.
struct MlflowServer {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl MlflowServer {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(loggers_venv().join("bin/mlflow"))
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string(), "--workers", "1"])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.path().join("mlflow.db").display()))
            .arg("--default-artifact-root")
            .arg(dir.path().join("artifacts"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("server.log")).unwrap())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let server = Self { child, url, _dir: dir };
        // It takes some seconds to start on two cores.
        wait_for("the mlflow server", 120.0, || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        server
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        signal(self.child.id(), libc::SIGTERM);
        let _ = self.child.wait();
    }
}

/// MLflow's own client: the sweep's runs, their params, tags, status and `loss` history.
const READ_MLFLOW: &str = r#"
import json, sys
from mlflow.tracking import MlflowClient
c = MlflowClient(sys.argv[1])
exp = c.get_experiment_by_name(sys.argv[2])
runs = c.search_runs([exp.experiment_id], max_results=1000)
out = {"runs": {}, "parents": []}
for r in runs:
    t = r.data.tags.get("nestor.trial_id")
    if t is None:
        out["parents"].append({"status": r.info.status, "name": r.info.run_name, "id": r.info.run_id})
        continue
    hist = sorted((m.step, m.value) for m in c.get_metric_history(r.info.run_id, "loss"))
    out["runs"][t] = {"params": r.data.params, "state": r.data.tags.get("nestor.state"), "status": r.info.status,
                      "parent": r.data.tags.get("mlflow.parentRunId"), "loss": hist, "metrics": sorted(r.data.metrics)}
print(json.dumps(out))
"#;

#[test]
fn mlflow_holds_a_run_per_trial_with_every_point() {
    let server = MlflowServer::start();
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "\n[failure]\nmax_failures = 1\n\n[[callbacks]]\ntype = \"mlflow\"\ntracking_uri = \"{}\"\nexperiment_name = \"nestor-test\"\n",
        server.url
    );
    write(
        dir.path(),
        &sweep(
            "ml",
            "num_samples = 3\nmax_concurrent_trials = 2\nseed = 7",
            "x = { uniform = [0.0, 1.0] }\nsteps = 5\ncheckpoint = true\nfail_at = { grid = [100, 3] }",
            &extra,
        ),
    );
    let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]);
    assert!(out.status.success() || out.status.code() == Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let rows = export(dir.path(), "runs/ml");
    let got = python_json(READ_MLFLOW, &[&server.url, "nestor-test"]);
    let parents = got["parents"].as_array().unwrap();
    assert_eq!(parents.len(), 1, "one parent run for the sweep: {got}");
    assert_eq!(parents[0]["status"], "FINISHED");
    let runs = got["runs"].as_object().unwrap();
    assert_eq!(runs.len(), 6, "a run per trial: {got}");
    let mut failed = 0;
    for (trial, run) in runs {
        assert_eq!(run["parent"], parents[0]["id"]);
        let results: Vec<&Value> = rows.iter().filter(|r| r["trial_id"] == trial.as_str()).collect();
        let stored: Vec<(u64, f64)> =
            results.iter().map(|r| (r["training_iteration"].as_u64().unwrap(), r["loss"].as_f64().unwrap())).collect();
        let logged: Vec<(u64, f64)> =
            run["loss"].as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap())).collect();
        assert_eq!(logged, stored, "{trial}: the full loss history");
        for m in ["acc", "time_total_s", "time_this_iter_s"] {
            assert!(run["metrics"].as_array().unwrap().iter().any(|k| k == m), "{trial} has {m}: {run}");
        }
        let config = &results[0]["config"];
        assert_eq!(run["params"]["x"].as_str().unwrap().parse::<f64>().unwrap(), config["x"].as_f64().unwrap());
        assert_eq!(run["params"]["steps"], "5");
        if config["fail_at"] == 3 {
            failed += 1;
            assert_eq!((run["state"].as_str(), run["status"].as_str()), (Some("ERROR"), Some("FAILED")), "{run}");
        } else {
            assert_eq!((run["state"].as_str(), run["status"].as_str()), (Some("TERMINATED"), Some("FINISHED")), "{run}");
        }
    }
    assert_eq!(failed, 3);
    // The mapping of trials to runs is kept for a resume.
    let kept: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("runs/ml/mlflow.json")).unwrap()).unwrap();
    assert_eq!(kept["runs"].as_object().unwrap().len(), 6);
}

#[test]
fn a_callback_without_its_settings_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &sweep("bad", "num_samples = 1", "x = 0.5", "\n[[callbacks]]\ntype = \"mlflow\"\ntracking_uri = \"file:///tmp/x\"\n"),
    );
    let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("callbacks[0].tracking_uri") && err.contains("not an http(s) URL"), "{err}");
    assert!(!dir.path().join("runs/bad").exists(), "nothing is written");
    write(dir.path(), &sweep("bad", "num_samples = 1", "x = 0.5", "\n[[callbacks]]\ntype = \"slack\"\n"));
    let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("slack"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// W&B's offline run files, read with W&B's own record type
/// (`wandb_internal_pb2.Record`) out of their log framing (a 7-byte file
/// header, 32 KiB blocks of chunks with a CRC-32, a length and a type):
/// per run, its name, config and every history row.
const READ_WANDB: &str = r#"
import glob, json, os, struct, sys, zlib
from wandb.proto import wandb_internal_pb2 as pb
def records(path):
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:7]
    at, block, buf = 7, 32768, b""
    while at + 7 <= len(data):
        left = block - (at % block)
        if left < 7:
            at += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[at:at + 7])
        chunk = data[at + 7:at + 7 + length]
        assert zlib.crc32(bytes([kind]) + chunk) & 0xffffffff == crc, "CRC"
        at += 7 + length
        if length == 0 and kind == 0:
            break
        buf += chunk
        if kind in (1, 4):
            r = pb.Record(); r.ParseFromString(buf); buf = b""
            yield r
out = {}
for f in glob.glob(os.path.join(sys.argv[1], "wandb", "offline-run-*", "*.wandb")):
    name, config, rows = None, {}, []
    for r in records(f):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            name = r.run.display_name
            for item in r.run.config.update:
                config[item.key] = json.loads(item.value_json)
        elif kind == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            rows.append(row)
    out.setdefault(name, {"config": config, "rows": []})["rows"].extend(rows)
print(json.dumps(out))
"#;

#[test]
fn wandb_offline_runs_hold_every_point() {
    let dir = tempfile::tempdir().unwrap();
    let python = loggers_venv().join("bin/python");
    let extra = format!("\n[[callbacks]]\ntype = \"wandb\"\nmode = \"offline\"\npython = \"{}\"\n", python.display());
    write(
        dir.path(),
        &sweep("wb", "num_samples = 4\nmax_concurrent_trials = 2\nseed = 9", "x = { uniform = [0.0, 1.0] }\nsteps = 5", &extra),
    );
    let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows = export(dir.path(), "runs/wb");
    let got = python_json(READ_WANDB, &[&dir.path().join("runs/wb").display().to_string()]);
    let runs = got.as_object().unwrap();
    assert_eq!(runs.len(), 4, "a run per trial: {got}");
    for (trial, run) in runs {
        let stored: Vec<(u64, f64)> = rows
            .iter()
            .filter(|r| r["trial_id"] == trial.as_str())
            .map(|r| (r["training_iteration"].as_u64().unwrap(), r["loss"].as_f64().unwrap()))
            .collect();
        let logged: Vec<(u64, f64)> = run["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|row| row.get("loss").is_some())
            .map(|row| (row["_step"].as_u64().unwrap(), row["loss"].as_f64().unwrap()))
            .collect();
        assert_eq!(logged, stored, "{trial}: every point at its step");
        let x = rows.iter().find(|r| r["trial_id"] == trial.as_str()).unwrap()["config"]["x"].as_f64();
        assert_eq!(run["config"]["x"].as_f64(), x, "{run}");
    }
}
