//! Trials whose number of workers changes mid-run, with real worker
//! processes: when a slot frees and no trial is left to start, the running
//! trial restarts from its checkpoint with 2 workers, its world size
//! follows, and its state and iterations carry on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

fn loss(step: u64) -> f64 {
    (0.5f64 - 0.3).powi(2) + 1.0 / step as f64
}

#[test]
fn a_trial_grows_from_one_to_two_workers_when_a_slot_frees() {
    let dir = tempfile::tempdir().unwrap();
    let space = "x = 0.5\nsteps = { grid = [3, 12] }\nsleep_ms = 150\ncheckpoint = true\nrank0_checkpoint = true\nreport_world_size = true";
    let extra = "\n[resources]\nCPU = 2\n\n[checkpoint]\nfrequency = 1\nnum_to_keep = 2\n\n\
                 [scheduler]\ntype = \"resource_changing\"\n\n[scheduler.base]\ntype = \"fifo\"\n";
    write(dir.path(), &sweep("grow", "", space, extra));
    let run = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]);
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    let stdout = ok(run);
    assert!(stdout.contains("2 trials (2 TERMINATED)"), "{stdout}");
    let exp = dir.path().join("runs/grow");
    let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
    let results = store.all_results().unwrap();
    let trials = store.trials().unwrap();
    let long = trials.iter().find(|t| t.config["steps"] == 12).unwrap();
    let short = trials.iter().find(|t| t.config["steps"] == 3).unwrap();
    // The short trial ran on one worker throughout.
    assert!(results[&short.id].iter().all(|r| r.metrics["world_size"] == 1.0));
    // The long one: once resized, it restarted from its checkpoint with 2 workers.
    assert_eq!((long.resizes, long.num_workers, long.resources.len(), long.restarts), (1, Some(2), 2, 0), "{long:?}");
    let history = tuner::store::effective_history(results[&long.id].clone());
    let sizes: Vec<(u64, f64)> = history.iter().map(|r| (r.training_iteration, r.metrics["world_size"])).collect();
    assert_eq!(sizes.iter().map(|s| s.0).collect::<Vec<_>>(), (1..=12).collect::<Vec<_>>(), "{sizes:?}");
    let grew = sizes.iter().position(|s| s.1 == 2.0).expect("never ran on 2 workers");
    assert!(grew > 0 && sizes[..grew].iter().all(|s| s.1 == 1.0) && sizes[grew..].iter().all(|s| s.1 == 2.0), "{sizes:?}");
    // Its state came through the restart: `acc` sums every step's loss exactly once.
    for r in &history {
        let expected: f64 = (1..=r.training_iteration).map(loss).sum();
        assert!((r.metrics["acc"] - expected).abs() < 1e-9, "step {}: acc {} != {expected}", r.training_iteration, r.metrics["acc"]);
    }
    // The run said so; `nestor status` shows its 2 workers.
    assert!(stderr.contains(&format!("{} restarts with 2 worker(s) (was 1) from checkpoint_", long.id)), "{stderr}");
    drop(store);
    let status = ok(nestor(dir.path(), &["status", "runs/grow"]));
    assert!(status.lines().any(|l| l.starts_with(&long.id) && l.contains(" 2 ")), "{status}");
    assert!(status.contains("    workers changed 1 time(s), now 2"), "{status}");
}

/// The driver killed after the trial grew: the resumed sweep runs it on 2
/// workers from its latest checkpoint, and its iterations and state carry on.
#[test]
fn a_grown_trial_keeps_its_workers_across_a_driver_kill() {
    let dir = tempfile::tempdir().unwrap();
    let space = "x = 0.5\nsteps = { grid = [3, 20] }\nsleep_ms = 150\ncheckpoint = true\nrank0_checkpoint = true\n\
                 report_world_size = true\ndump_env = true";
    let extra = "\n[resources]\nCPU = 2\n\n[checkpoint]\nfrequency = 1\nnum_to_keep = 1\n\n[scheduler]\ntype = \"resource_changing\"\n";
    write(dir.path(), &sweep("killed", "", space, extra));
    let exp = dir.path().join("runs/killed");
    let mut child = spawn_run(dir.path());
    // Rank 1 of the long trial has started: it grew.
    wait_for_run("the trial to grow to 2 workers", 60.0, &mut child, || exp.join("trials/trial_00001/rank-1.json").exists());
    std::thread::sleep(std::time::Duration::from_millis(400));
    signal(child.id(), libc::SIGKILL);
    child.wait().unwrap();
    wait_for("the workers to follow the driver", 10.0, || processes_mentioning(&exp.display().to_string()).is_empty());
    let stdout = ok(nestor(dir.path(), &["resume", &exp.display().to_string(), "--plain"]));
    assert!(stdout.contains("2 trials (2 TERMINATED)"), "{stdout}");
    let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
    let long = store.trial("trial_00001").unwrap().unwrap();
    assert_eq!(long.config["steps"], 20);
    // Interrupted while running on 2 workers (one restart), and on 2 after the resume too.
    assert_eq!((long.resizes, long.num_workers, long.resources.len(), long.restarts), (1, Some(2), 2, 1), "{long:?}");
    let history = tuner::store::effective_history(store.results("trial_00001").unwrap());
    assert_eq!(history.iter().map(|r| r.training_iteration).collect::<Vec<_>>(), (1..=20).collect::<Vec<_>>());
    let grew = history.iter().position(|r| r.metrics["world_size"] == 2.0).unwrap();
    assert!(history[grew..].iter().all(|r| r.metrics["world_size"] == 2.0), "{history:?}");
    for r in &history {
        let expected: f64 = (1..=r.training_iteration).map(loss).sum();
        assert!((r.metrics["acc"] - expected).abs() < 1e-9, "step {}: acc {} != {expected}", r.training_iteration, r.metrics["acc"]);
    }
}
