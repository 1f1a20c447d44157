//! Crash safety: kill -9 the driver mid-sweep at several points, resume, and
//! compare with an uninterrupted run of the same seed; Ctrl-C stops
//! gracefully and resumes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const SPACE: &str = "x = { uniform = [0.0, 1.0] }\nsteps = 8\nsleep_ms = 50\ncheckpoint = true";

/// trial id -> (config, final loss, iterations of its history)
type Summary = BTreeMap<String, (Value, f64, Vec<u64>)>;

fn summary(dir: &Path, exp: &str) -> Summary {
    let grid = tuner::ResultGrid::load(&dir.join(exp)).unwrap();
    grid.iter()
        .map(|t| {
            assert_eq!(
                t.status.as_str(),
                "TERMINATED",
                "{}: {:?}\n{}",
                t.trial_id,
                t.error,
                std::fs::read_to_string(t.path.join("logs/rank-0.log")).unwrap_or_default().lines().take(8).collect::<Vec<_>>().join("\n")
            );
            let loss = t.metrics.as_ref().unwrap()["loss"];
            (t.trial_id.clone(), (t.config.clone(), loss, t.history.iter().map(|r| r.training_iteration).collect()))
        })
        .collect()
}

/// Every step a worker logged as acknowledged has its result in the store.
fn acknowledged_results_are_stored(exp_dir: &Path) -> usize {
    let store = tuner::store::Store::open_existing(&exp_dir.join("store")).unwrap();
    let mut checked = 0;
    for t in store.trials().unwrap() {
        let log = std::fs::read_to_string(exp_dir.join("trials").join(&t.id).join("logs/rank-0.log")).unwrap_or_default();
        let stored: Vec<u64> = store.results(&t.id).unwrap().iter().map(|r| r.training_iteration).collect();
        for step in log.lines().filter_map(|l| l.strip_prefix("rank 0: acked step ")).map(|s| s.parse::<u64>().unwrap()) {
            assert!(stored.contains(&step), "{}: step {step} was acknowledged but is not stored ({stored:?})", t.id);
            checked += 1;
        }
    }
    checked
}

fn wait_no_workers(dir: &Path) {
    let needle = dir.display().to_string();
    let deadline = Instant::now() + Duration::from_secs(3);
    while !processes_mentioning(&needle).is_empty() {
        assert!(Instant::now() < deadline, "orphan workers: {:?}", processes_mentioning(&needle));
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn kill_9_at_any_moment_then_resume_matches_an_uninterrupted_run() {
    let text = sweep("crash", "num_samples = 8\nmax_concurrent_trials = 3\nseed = 99", SPACE, "");
    let reference_dir = tempfile::tempdir().unwrap();
    write(reference_dir.path(), &text);
    ok(nestor(reference_dir.path(), &["run", "sweep.toml", "--storage", "runs"]));
    let reference = summary(reference_dir.path(), "runs/crash");
    assert_eq!(reference.len(), 8);

    for kill_ms in [150, 450, 800, 1050] {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &text);
        let mut child = Command::new(nestor_bin())
            .args(["run", "sweep.toml", "--storage", "runs"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(kill_ms));
        // Killed while workers run (on a loaded machine, the next trial may be a moment away).
        wait_for(&format!("workers at {kill_ms} ms"), 2.0, || !processes_mentioning(&dir.path().display().to_string()).is_empty());
        signal(child.id(), libc::SIGKILL);
        let _ = child.wait();
        wait_no_workers(dir.path());
        let exp = dir.path().join("runs/crash");
        acknowledged_results_are_stored(&exp);

        let out = nestor(dir.path(), &["resume", "runs/crash"]);
        assert!(out.status.success(), "resume after kill at {kill_ms} ms: {}", String::from_utf8_lossy(&out.stderr));
        let resumed = summary(dir.path(), "runs/crash");
        assert_eq!(resumed, reference, "kill at {kill_ms} ms: resumed sweep differs from the uninterrupted one");
        wait_no_workers(dir.path());
    }
}

#[test]
fn ctrl_c_stops_gracefully_and_resume_finishes_the_sweep() {
    let text = sweep(
        "interrupt",
        "num_samples = 4\nmax_concurrent_trials = 2\nseed = 5",
        "x = { uniform = [0.0, 1.0] }\nsteps = 10\nsleep_ms = 60\ncheckpoint = true",
        "",
    );
    let reference_dir = tempfile::tempdir().unwrap();
    write(reference_dir.path(), &text);
    ok(nestor(reference_dir.path(), &["run", "sweep.toml", "--storage", "runs"]));
    let reference = summary(reference_dir.path(), "runs/interrupt");

    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &text);
    let child = spawn_run(dir.path());
    std::thread::sleep(Duration::from_millis(400));
    signal(child.id(), libc::SIGINT);
    let start = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(start.elapsed() < Duration::from_secs(3), "graceful stop took {:?}", start.elapsed());
    assert_eq!(out.status.code(), Some(130));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Interrupted: stopping running trials"), "{stderr}");
    assert!(stderr.lines().last().unwrap().starts_with("error: interrupted; resume with `nestor resume"), "{stderr}");
    let status = ok(nestor(dir.path(), &["status", "runs/interrupt"]));
    assert!(status.contains("PENDING"), "interrupted trials are recorded as PENDING: {status}");
    wait_no_workers(dir.path());

    ok(nestor(dir.path(), &["resume", "runs/interrupt"]));
    let resumed = summary(dir.path(), "runs/interrupt");
    assert_eq!(resumed, reference);
    let grid = tuner::ResultGrid::load(&dir.path().join("runs/interrupt")).unwrap();
    assert!(grid.iter().any(|t| t.restarts > 0), "the interrupted trials were restarted");
}

#[test]
fn a_second_ctrl_c_kills_workers_that_ignore_the_first() {
    let text =
        sweep("stubborn", "num_samples = 2\nmax_concurrent_trials = 2\nseed = 5", "steps = 2\nsleep_ms = 20000\nignore_sigterm = true", "")
            .replace("grace_period_s = 1.0", "grace_period_s = 60.0");
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &text);
    let child = spawn_run(dir.path());
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(500));
    signal(pid, libc::SIGINT);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(processes_mentioning(&dir.path().display().to_string()).len(), 2, "the workers ignore SIGTERM: still running");
    let start = Instant::now();
    signal(pid, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    assert!(start.elapsed() < Duration::from_secs(3), "the second Ctrl-C must not wait for the grace period");
    assert_eq!(out.status.code(), Some(130));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Killing running trials"));
    wait_no_workers(dir.path());
    let status = ok(nestor(dir.path(), &["status", "runs/stubborn"]));
    assert_eq!(status.matches("PENDING").count(), 3, "both trials are resumable: {status}");
}
