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
