//! Schedulers with real worker processes: promotion ASHA pausing trials and
//! resuming them from their checkpoints, and the same schedule after the
//! driver is killed (twice) and the sweep resumed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

fn promotion_sweep(name: &str) -> String {
    sweep(
        name,
        "num_samples = 12\nmax_concurrent_trials = 1\nseed = 4",
        "x = { uniform = [0.0, 1.0] }\nsteps = 9\nsleep_ms = 25\ncheckpoint = true",
        "\n[checkpoint]\nfrequency = 1\n\n[scheduler]\ntype = \"asha\"\nasha_type = \"promotion\"\nmax_t = 9\nreduction_factor = 3\n",
    )
}

#[test]
fn promotion_asha_resumes_paused_trials_from_their_rung_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &promotion_sweep("promo"));
    let stdout = ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]));
    assert!(stdout.contains("12 trials (12 TERMINATED)"), "{stdout}");
    let exp = dir.path().join("runs/promo");
    let grid = tuner::ResultGrid::load(&exp).unwrap();
    let resumed: Vec<&tuner::TrialOutcome> = grid.iter().filter(|t| t.resumes > 0).collect();
    assert!(!resumed.is_empty(), "no trial was paused and promoted");
    for t in &resumed {
        let log = read(&exp.join(format!("trials/{}/logs/rank-0.log", t.trial_id)));
        let steps: Vec<u64> = log.lines().filter_map(|l| l.split(" at step ").nth(1)).map(|s| s.trim().parse().unwrap()).collect();
        assert_eq!(steps.len() as u32, t.resumes, "{}: {log}", t.trial_id);
        for s in steps {
            // Paused at a rung (1 or 3), resumed from that rung's checkpoint, acked the next step.
            assert!(s == 1 || s == 3, "{}: resumed at step {s}", t.trial_id);
            assert!(log.contains(&format!("checkpoint_{s:06}/rank-0 at step {s}")), "{log}");
            assert!(log.contains(&format!("acked step {}", s + 1)), "{log}");
        }
    }
    let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
    for (id, results) in store.all_results().unwrap() {
        let its: Vec<u64> = results.iter().map(|r| r.training_iteration).collect();
        assert_eq!(its, (1..=its.len() as u64).collect::<Vec<_>>(), "{id}: a step ran twice or was skipped");
    }
}

#[test]
fn the_same_schedule_after_the_driver_is_killed_twice_and_resumed() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &promotion_sweep("reference"));
    ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]));
    let reference = outcome(&dir.path().join("runs/reference"));

    write(dir.path(), &promotion_sweep("killed"));
    let exp = dir.path().join("runs/killed");
    let kill_when = |what: &str, done: &dyn Fn() -> bool, resume: bool| {
        let mut child =
            if resume { spawn_nestor(dir.path(), &["resume", &exp.display().to_string(), "--plain"], &[]) } else { spawn_run(dir.path()) };
        wait_for_run(what, 60.0, &mut child, done);
        signal(child.id(), libc::SIGKILL);
        child.wait().unwrap();
        // Its workers notice their driver is gone and exit.
        wait_for("the workers to exit", 10.0, || processes_mentioning(&exp.display().to_string()).is_empty());
    };
    kill_when("trial 4 to start", &|| exp.join("trials/trial_00004/result.jsonl").exists(), false);
    kill_when("trial 8 to start", &|| exp.join("trials/trial_00008/result.jsonl").exists(), true);
    ok(nestor(dir.path(), &["resume", &exp.display().to_string(), "--plain"]));
    let resumed = outcome(&exp);
    assert_eq!(resumed.len(), 12);
    assert_eq!(resumed, reference, "killed and resumed twice, the sweep decided otherwise");
}
