//! Multi-worker trials through the `nestor` binary: a process per rank with
//! the torchrun environment, GPUs from declared resources, the whole group
//! stopped when one rank fails, and no process left behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn rank_dump(exp: &Path, trial: &str, rank: u32) -> Value {
    let dir = if trial.is_empty() { exp.to_path_buf() } else { exp.join("trials").join(trial) };
    let path = dir.join(format!("rank-{rank}.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn alive(pid: u64) -> bool {
    // A zombie is gone for our purposes (it holds nothing).
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| !s.lines().any(|l| l.starts_with("State:") && l.contains('Z')))
}

#[test]
fn each_rank_gets_the_torchrun_environment_and_its_own_gpus() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &format!(
            "{}\n[resources]\nCPU = 8\nGPU = 4\n",
            sweep(
                "gpus",
                "num_samples = 2\nseed = 4",
                "x = { uniform = [0.0, 1.0] }\nsteps = 3\nsleep_ms = 150\ndump_env = true\ncheckpoint = true",
                "num_workers = 2\nuse_gpu = true\nresources_per_worker = { CPU = 2, GPU = 1 }",
            )
        ),
    );
    let out = ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]));
    assert!(out.contains("2 trials (2 TERMINATED)"), "{out}");
    let exp = dir.path().join("runs/gpus");
    let mut all_gpus = BTreeSet::new();
    let mut ports = BTreeSet::new();
    for trial in ["trial_00000", "trial_00001"] {
        let (r0, r1) = (rank_dump(&exp, trial, 0), rank_dump(&exp, trial, 1));
        for (rank, d) in [(0, &r0), (1, &r1)] {
            assert_eq!(d["RANK"], rank.to_string());
            assert_eq!(d["LOCAL_RANK"], rank.to_string());
            assert_eq!(d["WORLD_SIZE"], "2");
            assert_eq!(d["LOCAL_WORLD_SIZE"], "2");
            assert_eq!(d["NODE_RANK"], "0");
            assert_eq!(d["MASTER_ADDR"], "127.0.0.1");
            assert_eq!(d["OMP_NUM_THREADS"], "2", "the bundle's CPUs");
            assert_eq!(d["NESTOR_TORCH_BACKEND"], "nccl", "the default with use_gpu");
            assert_eq!(d["world_size"], 2);
            let gpus = d["CUDA_VISIBLE_DEVICES"].as_str().unwrap();
            assert_eq!(gpus.split(',').count(), 1, "one GPU per worker: {gpus}");
            assert!(all_gpus.insert(gpus.to_string()), "GPU {gpus} handed out twice while both trials ran");
        }
        assert_eq!(r0["MASTER_PORT"], r1["MASTER_PORT"], "one rendezvous per trial");
        let rendezvous = r0["NESTOR_RENDEZVOUS_FILE"].as_str().unwrap();
        assert_eq!(r1["NESTOR_RENDEZVOUS_FILE"], rendezvous);
        assert!(rendezvous.starts_with(exp.join("trials").join(trial).to_str().unwrap()), "{rendezvous}");
        assert!(!Path::new(rendezvous).exists(), "the rendezvous file is removed with the group");
        ports.insert(r0["MASTER_PORT"].as_str().unwrap().to_string());
        for r in 0..2 {
            let log = std::fs::read_to_string(exp.join(format!("trials/{trial}/logs/rank-{r}.log"))).unwrap();
            assert!(log.contains(&format!("rank {r}: acked step 3")), "rank {r}'s own log: {log}");
            // Every rank's shard of the last checkpoint is there.
            let state = std::fs::read_to_string(exp.join(format!("trials/{trial}/checkpoint_000003/rank-{r}/state.json"))).unwrap();
            assert!(state.contains("\"step\":3"), "{state}");
        }
    }
    assert_eq!(all_gpus, ["0", "1", "2", "3"].map(String::from).into_iter().collect());
    // The store keeps each trial's bundles; `nestor status` shows them.
    let grid = tuner::ResultGrid::load(&exp).unwrap();
    let held: BTreeSet<u32> = grid.iter().flat_map(|t| t.resources.iter().flat_map(|b| b.gpus.clone())).collect();
    assert_eq!(held, [0, 1, 2, 3].into_iter().collect());
    let status = ok(nestor(dir.path(), &["status", "runs/gpus"]));
    assert_eq!(status.matches(" 2 gpu:").count(), 2, "{status}");
    assert_eq!(ports.len(), 2, "a port per trial");
    // The trial's result is rank 0's (the others report loss + 100 * rank), one per step.
    let rows = export(dir.path(), "runs/gpus");
    assert_eq!(rows.len(), 6, "one result per step, not per rank");
    for r in &rows {
        let x = r["config"]["x"].as_f64().unwrap();
        let step = r["training_iteration"].as_f64().unwrap();
        assert!((r["loss"].as_f64().unwrap() - ((x - 0.3).powi(2) + 1.0 / step)).abs() < 1e-12, "{r}");
    }
}

#[test]
fn a_failing_rank_stops_its_group_at_once_and_leaves_no_process() {
    let dir = tempfile::tempdir().unwrap();
    // Rank 1 fails at step 2. Rank 0 is then waiting for rank 1's step-2 report and
    // ignores SIGTERM; the grace period is 30 s, the trial would run 60 s: the group
    // must still be gone within about a second.
    let text = sweep(
        "fails",
        "num_samples = 1\nseed = 1",
        "x = 0.5\nsteps = 600\nsleep_ms = 100\nfail_at = 2\nfail_rank = 1\nignore_sigterm = true\nleak_child = true\ndump_env = true\ncheckpoint = true",
        "num_workers = 2",
    )
    .replace("grace_period_s = 1.0", "grace_period_s = 30.0");
    write(dir.path(), &text);
    let started = Instant::now();
    let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]);
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(10), "the failed group took {elapsed:?} to stop");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 trial (1 ERROR)"), "{stdout}");
    let grid = tuner::ResultGrid::load(&dir.path().join("runs/fails")).unwrap();
    let trial = grid.get("trial_00000").unwrap();
    // Rank 0 reported step 2 (with its shard); rank 1 died first: step 2 is no result, its checkpoint never committed.
    assert_eq!(trial.history.iter().map(|r| r.training_iteration).collect::<Vec<_>>(), [1]);
    assert!(trial.checkpoint().unwrap().ends_with("checkpoint_000001"));
    let error = trial.error.clone().unwrap();
    assert!(error.starts_with("rank 1 exited with code 3"), "{error}");
    assert!(error.contains("fixture: failing on purpose at step 2"), "the rank's log tail: {error}");
    assert!(error.contains("rank-1.log"), "{error}");
    let exp = dir.path().join("runs/fails");
    for rank in 0..2 {
        let d = rank_dump(&exp, "trial_00000", rank);
        for key in ["pid", "child"] {
            let pid = d[key].as_u64().unwrap();
            assert!(!alive(pid), "rank {rank}'s {key} {pid} outlived its trial");
        }
    }
}

#[test]
fn killing_the_driver_takes_every_rank_with_it() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &sweep("orphans", "num_samples = 1\nseed = 1", "x = 0.5\nsteps = 600\nsleep_ms = 100\ndump_env = true", "num_workers = 2"),
    );
    let mut child = spawn_run(dir.path());
    let exp = dir.path().join("runs/orphans/trials/trial_00000");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(exp.join("rank-0.json").exists() && exp.join("rank-1.json").exists()) {
        assert!(Instant::now() < deadline, "the ranks never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    signal(child.id(), libc::SIGKILL);
    child.wait().unwrap();
    let pids: Vec<u64> = (0..2).map(|r| rank_dump(&dir.path().join("runs/orphans"), "trial_00000", r)["pid"].as_u64().unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|&p| alive(p)) {
        assert!(Instant::now() < deadline, "ranks {pids:?} outlived the driver");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn trials_wait_for_resources_and_one_that_can_never_fit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // 3 CPUs declared, 2 workers x 1 CPU per trial: one trial at a time, whatever max_concurrent_trials says.
    write(
        dir.path(),
        &format!(
            "{}\n[resources]\nCPU = 3\n",
            sweep(
                "fit",
                "num_samples = 3\nmax_concurrent_trials = 3\nseed = 1",
                "x = 0.5\nsteps = 2\nsleep_ms = 50\ndump_env = true",
                "num_workers = 2"
            )
        ),
    );
    let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]);
    let note = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(note.contains("(3 trials, 1 at a time)"), "{note}");
    let out = ok(out);
    assert!(out.contains("3 trials (3 TERMINATED)"), "{out}");

    // More GPUs than the node has: refused before anything is written.
    write(dir.path(), &sweep("never", "num_samples = 1", "x = 0.5", "num_workers = 2\nuse_gpu = true"));
    let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a trial asks for 2 worker(s) x {CPU: 1, GPU: 1}, but the node has {CPU: "), "{err}");
    assert!(err.contains("GPU: 0"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!dir.path().join("runs/never").exists(), "nothing written");

    for (extra, expected) in [
        ("num_workers = 0", "sweep.toml: trainer.num_workers: must be at least 1"),
        (
            "resources_per_worker = { GPU = 1 }",
            "sweep.toml: trainer.use_gpu: is false, but resources_per_worker.GPU = 1; set use_gpu = true",
        ),
        ("placement_strategy = \"TIGHT\"", "unknown variant `TIGHT`"),
    ] {
        write(dir.path(), &sweep("bad", "num_samples = 1", "x = 0.5", extra));
        let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(expected), "{extra}: {err}");
    }
}

#[test]
fn a_trainer_runs_worker_processes_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    // Six ranks, some steps apart: every rank lives until the run ends (a rank
    // spawned from a short-lived thread would die with it, by PR_SET_PDEATHSIG).
    let out = trainer::Trainer::command([worker()])
        .scaling(trainer::ScalingConfig::workers(6))
        .resources(trainer::NodeResources::declared(6.0))
        .config(serde_json::json!({ "x": 0.5, "steps": 3, "sleep_ms": 100, "checkpoint": true, "dump_env": true }))
        .storage(dir.path())
        .name("solo")
        .fit()
        .unwrap();
    let steps: Vec<u64> = out.history.iter().map(|s| s.training_iteration).collect();
    assert_eq!(steps, [1, 2, 3]);
    let m = out.metrics.unwrap();
    assert!((m["loss"] - (0.04 + 1.0 / 3.0)).abs() < 1e-12, "rank 0's metrics: {m:?}");
    let ckpt = out.checkpoint.unwrap();
    for r in 0..6 {
        assert!(ckpt.join(format!("rank-{r}/state.json")).is_file());
        assert_eq!(rank_dump(&dir.path().join("solo"), "", r)["WORLD_SIZE"], "6");
    }

    // A rank that fails fails the run, naming it.
    let err = trainer::Trainer::command([worker()])
        .scaling(trainer::ScalingConfig::workers(2))
        .resources(trainer::NodeResources::declared(2.0))
        .config(serde_json::json!({ "x": 0.5, "steps": 5, "fail_at": 2, "fail_rank": 1 }))
        .storage(dir.path())
        .name("fails")
        .fit()
        .unwrap_err();
    assert!(err.to_string().starts_with("training failed: rank 1 exited with code 3"), "{err}");
}
