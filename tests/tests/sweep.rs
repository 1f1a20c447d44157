//! Whole sweeps through the `nestor` binary with real worker processes
//! reporting over gRPC on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;

#[test]
fn run_then_best_status_and_export() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &sweep(
            "basic",
            "num_samples = 6\nmax_concurrent_trials = 3\nseed = 11",
            "x = { uniform = [0.0, 1.0] }\nsteps = 4\ncheckpoint = true",
            "",
        ),
    );
    let out = ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]));
    assert!(out.contains("6 trials (6 TERMINATED)"), "{out}");

    let best: Value = serde_json::from_str(&ok(nestor(dir.path(), &["best", "runs/basic", "--json"]))).unwrap();
    // The fixture's final loss is (x - 0.3)^2 + 1/4: the best trial is the one with x nearest 0.3.
    let rows = export(dir.path(), "runs/basic");
    let mut finals: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r["training_iteration"] == 4)
        .map(|r| (r["trial_id"].as_str().unwrap().to_string(), r["config"]["x"].as_f64().unwrap()))
        .collect();
    assert_eq!(finals.len(), 6);
    finals.sort_by(|a, b| (a.1 - 0.3).abs().total_cmp(&(b.1 - 0.3).abs()));
    assert_eq!(best["trial_id"], finals[0].0.as_str());
    let x = best["config"]["x"].as_f64().unwrap();
    assert!((best["metrics"]["loss"].as_f64().unwrap() - ((x - 0.3).powi(2) + 0.25)).abs() < 1e-12);
    assert_eq!(best["metrics"]["training_iteration"], 4.0);
    let ckpt = best["checkpoint"].as_str().unwrap();
    assert!(ckpt.ends_with("checkpoint_000004"), "{ckpt}");
    let state: Value = serde_json::from_slice(&std::fs::read(format!("{ckpt}/rank-0/state.json")).unwrap()).unwrap();
    assert_eq!(state["step"], 4);

    // Every result is there, in order, with its config.
    assert_eq!(rows.len(), 24);
    for r in &rows {
        assert!(r["loss"].is_number() && r["config"]["steps"] == 4 && r["trial_id"].is_string());
    }
    let csv = ok(nestor(dir.path(), &["export", "runs/basic", "--format", "csv"]));
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(&header[..2], ["trial_id", "training_iteration"]);
    assert!(header.contains(&"loss") && header.contains(&"config/x"));
    assert_eq!(lines.count(), 24);

    let status = ok(nestor(dir.path(), &["status", "runs/basic"]));
    assert_eq!(status.matches("TERMINATED").count(), 7, "{status}"); // 6 rows + the summary line

    // The files for people.
    let t0 = dir.path().join("runs/basic/trials/trial_00000");
    let params: Value = serde_json::from_slice(&std::fs::read(t0.join("params.json")).unwrap()).unwrap();
    assert_eq!(params["steps"], 4);
    assert_eq!(std::fs::read_to_string(t0.join("result.jsonl")).unwrap().lines().count(), 4);
    assert_eq!(std::fs::read_to_string(t0.join("progress.csv")).unwrap().lines().count(), 5);
    assert!(dir.path().join("runs/basic/experiment.toml").exists());

    // A second run into the same directory is refused, leaving it intact.
    let again = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists; resume it with `nestor resume"));
    assert_eq!(export(dir.path(), "runs/basic").len(), 24);
}

#[test]
fn a_failing_trial_is_recorded_and_the_sweep_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &sweep(
            "fails",
            "num_samples = 2\nmax_concurrent_trials = 2\nseed = 3",
            "x = { uniform = [0.0, 1.0] }\nsteps = 4\nfail_at = { grid = [2, 99] }",
            "",
        ),
    );
    let out = ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]));
    assert!(out.contains("4 trials (2 TERMINATED, 2 ERROR)"), "{out}");
    let status = ok(nestor(dir.path(), &["status", "runs/fails"]));
    assert!(status.contains("rank 0 exited with code 3"), "{status}");
    let rows = export(dir.path(), "runs/fails");
    for r in &rows {
        if r["config"]["fail_at"] == 2 {
            assert_eq!(r["training_iteration"], 1, "a failing trial keeps what it reported");
        }
    }
    // The error carries the worker's last log lines.
    let grid = tuner::ResultGrid::load(&dir.path().join("runs/fails")).unwrap();
    let e = grid.errors()[0].error.clone().unwrap();
    assert!(e.contains("fixture: failing on purpose at step 2"), "{e}");
}

#[test]
fn fail_fast_ends_the_sweep_at_the_first_error() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &sweep("ff", "num_samples = 5\nmax_concurrent_trials = 1\nseed = 3\nfail_fast = true", "steps = 3\nfail_at = 2", ""));
    let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]);
    assert_eq!(out.status.code(), Some(3), "fail_fast has its own exit code");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("fail_fast: trial_00000: rank 0 exited with code 3"), "{stderr}");
    let grid = tuner::ResultGrid::load(&dir.path().join("runs/ff")).unwrap();
    assert_eq!(grid.len(), 1, "no trial starts after the first failure");
}

#[test]
fn a_trial_without_the_metric_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &sweep("nometric", "num_samples = 1\nseed = 3", "steps = 3\nomit_metric = true", ""));
    ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]));
    let grid = tuner::ResultGrid::load(&dir.path().join("runs/nometric")).unwrap();
    let e = grid.errors()[0].error.clone().unwrap();
    assert_eq!(e, "trial reported no `loss` (the experiment's metric); it reported: acc, other, step, time_this_iter_s, time_total_s, timestamp, training_iteration");
}

#[test]
fn stop_criteria_end_trials() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &sweep("stops", "num_samples = 3\nseed = 1", "x = { uniform = [0.0, 1.0] }\nsteps = 50", "\n[stop]\ntraining_iteration = 3\n"),
    );
    ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]));
    let rows = export(dir.path(), "runs/stops");
    assert_eq!(rows.len(), 9);
    assert!(rows.iter().all(|r| r["training_iteration"].as_u64().unwrap() <= 3));
    // A metric threshold, set from the command line.
    ok(nestor(
        dir.path(),
        &[
            "run",
            "sweep.toml",
            "--storage",
            "runs",
            "--set",
            "experiment.name=stops2",
            "--set",
            "stop.step=2",
            "--set",
            "stop.training_iteration=10",
        ],
    ));
    let rows = export(dir.path(), "runs/stops2");
    assert_eq!(rows.len(), 6, "each trial stops once step >= 2");
}

#[test]
fn a_worker_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &sweep("stubborn", "num_samples = 1\nseed = 1\ntime_budget_s = 0.5", "steps = 1000\nsleep_ms = 10000\nignore_sigterm = true", ""),
    );
    let start = std::time::Instant::now();
    let out = ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]));
    let took = start.elapsed().as_secs_f64();
    // SIGTERM at 0.5 s is ignored; SIGKILL follows the 1 s grace period,
    // long before the worker's first report at 10 s.
    assert!((1.4..8.0).contains(&took), "took {took}s");
    assert!(out.contains("1 TERMINATED"), "{out}");
    assert!(processes_mentioning(&dir.path().display().to_string()).is_empty(), "no worker may survive");
}

#[test]
fn status_works_while_the_sweep_runs() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &sweep(
            "live",
            "num_samples = 3\nmax_concurrent_trials = 2\nseed = 2",
            "x = { uniform = [0.0, 1.0] }\nsteps = 40\nsleep_ms = 50",
            "",
        ),
    );
    let child = spawn_run(dir.path());
    // Each trial takes 2 s; the live view is rewritten every 0.5 s.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let live = ok(nestor(dir.path(), &["status", "runs/live"]));
    assert!(live.contains("is running (pid"), "{live}");
    assert!(live.contains("2 of 3 trials so far (2 RUNNING, 0 TERMINATED, 0 ERROR, 0 PAUSED, 1 to run)"), "{live}");
    assert!(live.contains("running for "), "{live}");
    assert_eq!(live.lines().filter(|l| l.starts_with("trial_0000")).count(), 2, "{live}");
    // The store itself is the running sweep's: queries say so in one line.
    let best = nestor(dir.path(), &["best", "runs/live"]);
    assert_eq!(best.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&best.stderr).contains("in use by a running sweep"));
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(!dir.path().join("runs/live/status.json").exists(), "the live view goes when the sweep ends");
    assert!(ok(nestor(dir.path(), &["status", "runs/live"])).contains("3 trials (3 TERMINATED)"));
}

#[test]
fn a_child_leaked_by_a_worker_does_not_outlive_its_trial() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &sweep("leak", "num_samples = 2\nseed = 2", "steps = 2\nleak_child = true", ""));
    ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]));
    let needle = dir.path().display().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while !processes_mentioning(&needle).is_empty() {
        assert!(std::time::Instant::now() < deadline, "leaked processes: {:?}", processes_mentioning(&needle));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
