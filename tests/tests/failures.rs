//! Failure restarts with real worker processes: a rank killed with -9, a
//! hung rank, a trial that keeps failing, and the driver killed while a
//! checkpoint is being persisted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;
use tuner::{ResultGrid, TrialStatus};

fn rank_json(trial_dir: &Path, rank: u32) -> Option<serde_json::Value> {
    serde_json::from_str(&read(&trial_dir.join(format!("rank-{rank}.json")))).ok()
}

/// The fixture's loss at `step` for x = 0.5 on rank 0, and the running sum
/// of the losses up to it (what its checkpoint carries).
fn expected(step: u64) -> (f64, f64) {
    let loss = |s: u64| (0.5f64 - 0.3).powi(2) + 1.0 / s as f64;
    let acc = (1..=step).fold(0.0, |a, s| a + loss(s));
    (loss(step), acc)
}

fn iterations(grid: &ResultGrid, id: &str) -> Vec<u64> {
    grid.get(id).unwrap().history.iter().map(|r| r.training_iteration).collect()
}

#[test]
fn a_killed_rank_restarts_the_group_from_the_last_checkpoint_within_two_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let space = "x = 0.5\nsteps = 8\nsleep_ms = 250\ncheckpoint = true\ndump_env = true";
    write(dir.path(), &sweep("kill", "", space, "num_workers = 2\n\n[failure]\nmax_failures = 2"));
    let mut run = spawn_run(dir.path());
    let trial = dir.path().join("runs/kill/trials/trial_00000");
    wait_for_run("checkpoint 3 committed", 30.0, &mut run, || trial.join("checkpoint_000003/.committed").exists());
    let victim = rank_json(&trial, 1).unwrap()["pid"].as_u64().unwrap() as u32;
    let killed_at = now();
    signal(victim, libc::SIGKILL);
    let restarted = |r| rank_json(&trial, r).and_then(|j| j["started_at"].as_f64()).filter(|t| *t > killed_at);
    wait_for("both ranks running again", 10.0, || restarted(0).is_some() && restarted(1).is_some());
    let back = restarted(0).unwrap().max(restarted(1).unwrap()) - killed_at;
    eprintln!("failover: the group was back {:.0} ms after the kill", back * 1e3);
    assert!(back < 2.0, "the group took {back:.3} s to come back");
    for r in 0..2 {
        let from = rank_json(&trial, r).unwrap()["NESTOR_CHECKPOINT"].as_str().unwrap().to_string();
        let k: u64 = from.rsplit('/').nth(1).unwrap().trim_start_matches("checkpoint_").parse().unwrap();
        assert!(k >= 3 && from.ends_with(&format!("rank-{r}")), "rank {r} restarted from {from}");
    }
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("trial_00000: rank 1 was killed by signal 9; log: "), "{stdout}");
    assert!(stdout.contains("rank-1.log; restarting from checkpoint_0000"), "{stdout}");
    assert!(stdout.contains("(failure 1 of 2)"), "{stdout}");

    let grid = ResultGrid::load(&dir.path().join("runs/kill")).unwrap();
    let t = grid.get("trial_00000").unwrap();
    assert_eq!((t.status, t.failures, t.restarts), (TrialStatus::Terminated, 1, 1));
    assert!(t.last_failure.as_deref().unwrap().starts_with("rank 1 was killed by signal 9"));
    assert_eq!(iterations(&grid, "trial_00000"), (1..=8).collect::<Vec<_>>(), "nothing after the checkpoint counts twice");
    // The same final metrics as an uninterrupted run: the state came back whole.
    let (loss, acc) = expected(8);
    let m = t.metrics.as_ref().unwrap();
    assert_eq!((m["loss"], m["acc"]), (loss, acc));
    assert!(processes_mentioning(&dir.path().display().to_string()).is_empty(), "a worker survived");
}

#[test]
fn a_hung_rank_is_killed_after_the_timeout_and_the_trial_restarts() {
    let dir = tempfile::tempdir().unwrap();
    // Rank 1 stops reporting at step 3 (in its first run only) and ignores SIGTERM.
    let space = "x = 0.5\nsteps = 5\nsleep_ms = 50\ncheckpoint = true\nhang_at = 3\nfail_rank = 1\nignore_sigterm = true";
    let extra = "num_workers = 2\ngrace_period_s = 30.0\n\n[failure]\nmax_failures = 1\nhang_timeout_s = 1.0";
    write(dir.path(), &sweep("hang", "", space, extra).replace("grace_period_s = 1.0\n", ""));
    let started = std::time::Instant::now();
    let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}");
    let took = started.elapsed().as_secs_f64();
    assert!(took < 10.0, "a 30 s grace period was waited for: {took:.1} s");
    assert!(
        stdout.contains("trial_00000: hung: no report for 1 s (failure.hang_timeout_s) after iteration 2; waiting on rank 1"),
        "{stdout}"
    );

    let grid = ResultGrid::load(&dir.path().join("runs/hang")).unwrap();
    let t = grid.get("trial_00000").unwrap();
    assert_eq!((t.status, t.failures), (TrialStatus::Terminated, 1));
    let failure = t.last_failure.as_deref().unwrap();
    assert!(failure.contains("hanging on purpose at step 3"), "the hung rank's log tail: {failure}");
    assert_eq!(iterations(&grid, "trial_00000"), vec![1, 2, 3, 4, 5]);
    assert_eq!(t.metrics.as_ref().unwrap()["acc"], expected(5).1);
    assert!(processes_mentioning(&dir.path().display().to_string()).is_empty(), "a worker survived");
}

#[test]
fn after_max_failures_the_trial_is_error_and_the_sweep_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let space = "x = 0.5\nsteps = 4\ncheckpoint = true\nfail_at = { grid = [2, 100] }";
    // Two ranks: rank 1 saves its shard of step 2 before rank 0 fails there.
    write(dir.path(), &sweep("flaky", "max_concurrent_trials = 1", space, "num_workers = 2\n\n[failure]\nmax_failures = 2"));
    let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("(failure 2 of 2)"), "{stdout}");
    assert!(!stdout.contains("(failure 3 of 2)"), "{stdout}");
    let grid = ResultGrid::load(&dir.path().join("runs/flaky")).unwrap();
    let failing = grid.iter().find(|t| t.config["fail_at"] == 2).unwrap();
    let fine = grid.iter().find(|t| t.config["fail_at"] == 100).unwrap();
    assert_eq!((failing.status, failing.failures, failing.restarts), (TrialStatus::Error, 3, 2));
    let error = failing.error.as_deref().unwrap();
    assert!(error.starts_with("rank 0 exited with code 3; last log lines"), "{error}");
    assert!(error.contains("failing on purpose at step 2"), "{error}");
    // Every run restarted from checkpoint 1: the history never went past it.
    assert_eq!(iterations(&grid, &failing.trial_id), vec![1]);
    assert_eq!((fine.status, fine.failures), (TrialStatus::Terminated, 0));
    assert_eq!(iterations(&grid, &fine.trial_id), vec![1, 2, 3, 4]);
    assert!(processes_mentioning(&dir.path().display().to_string()).is_empty(), "a worker survived");
    // What the failed runs left half written is gone; the committed checkpoint stays.
    let left: Vec<String> = std::fs::read_dir(dir.path().join("runs/flaky/trials").join(&failing.trial_id))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint_"))
        .collect();
    assert_eq!(left, vec!["checkpoint_000001"]);
    let status = ok(nestor(dir.path(), &["status", "runs/flaky"]));
    assert!(
        status.lines().any(|l| l.starts_with(&failing.trial_id) && l.contains("ERROR") && l.split_whitespace().nth(5) == Some("3")),
        "{status}"
    );
}

#[test]
fn a_driver_killed_while_a_checkpoint_is_persisted_resumes_from_a_whole_one() {
    let dir = tempfile::tempdir().unwrap();
    // 256 MiB shards: the copy takes long enough to be killed in the middle.
    let space = "x = 0.5\nsteps = 3\ncheckpoint = true\nckpt_mb = 256\ndump_env = true";
    write(dir.path(), &sweep("crash", "", space, ""));
    let mut run = spawn_run(dir.path());
    let trial = dir.path().join("runs/crash/trials/trial_00000");
    wait_for_run("the second checkpoint to start", 60.0, &mut run, || {
        read(&trial.join("logs/rank-0.log")).contains("checkpointing step 2")
    });
    signal(run.id(), libc::SIGKILL);
    let _ = run.wait();
    let partial = trial.join("checkpoint_000002/.rank-0.tmp").exists();
    eprintln!("killed with checkpoint 2 {}", if partial { "half copied" } else { "not yet copied or whole" });
    wait_for("the worker to follow the driver", 10.0, || processes_mentioning(&dir.path().display().to_string()).is_empty());

    ok(nestor(dir.path(), &["resume", "runs/crash", "--plain"]));
    let grid = ResultGrid::load(&dir.path().join("runs/crash")).unwrap();
    let t = grid.get("trial_00000").unwrap();
    // The fixture refuses a checkpoint whose blob is not whole, so a partial
    // copy restored would have failed the trial.
    assert_eq!(t.status, TrialStatus::Terminated, "{:?}", t.error);
    let from = rank_json(&trial, 0).unwrap()["NESTOR_CHECKPOINT"].as_str().unwrap().to_string();
    assert!(from.ends_with("checkpoint_000001/rank-0") || (!partial && from.ends_with("checkpoint_000002/rank-0")), "{from}");
    assert_eq!(iterations(&grid, "trial_00000"), vec![1, 2, 3]);
    assert_eq!(t.metrics.as_ref().unwrap()["acc"], expected(3).1);
    assert!(!trial.join("checkpoint_000002/.rank-0.tmp").exists(), "the half copy was replaced");
}

#[test]
fn a_checkpoint_of_two_ranks_is_not_restored_on_one() {
    let dir = tempfile::tempdir().unwrap();
    // Both ranks save a shard.
    write(dir.path(), &sweep("shrink", "", "x = 0.5\nsteps = 50\nsleep_ms = 100\ncheckpoint = true", "num_workers = 2"));
    let mut run = spawn_run(dir.path());
    let exp = dir.path().join("runs/shrink");
    wait_for_run("checkpoint 2 committed", 30.0, &mut run, || exp.join("trials/trial_00000/checkpoint_000002/.committed").exists());
    signal(run.id(), libc::SIGKILL);
    let _ = run.wait_with_output();
    wait_for("the workers to follow the driver", 10.0, || processes_mentioning(&dir.path().display().to_string()).is_empty());

    let one_worker =
        tuner::Trainable::process(trainer::ProcessConfig::new(vec![worker().to_string()])).scaling(tuner::ScalingConfig::workers(1));
    let grid = tuner::Tuner::restore(&exp, Some(one_worker)).unwrap().progress(tuner::ProgressMode::Quiet).fit().unwrap();
    let t = grid.get("trial_00000").unwrap();
    assert_eq!(t.status, TrialStatus::Error);
    let error = t.error.as_deref().unwrap();
    assert!(error.starts_with(&format!("checkpoint {}", exp.join("trials/trial_00000/checkpoint_0000").display())), "{error}");
    assert!(
        error.ends_with(
            "holds the shards of 2 ranks (rank-0, rank-1), but the trial now runs 1 worker(s); restore it with trainer.num_workers = 2"
        ),
        "{error}"
    );
    // Nothing ran: no third checkpoint, and the committed ones are intact.
    assert!(t.checkpoints.iter().all(|c| c.iteration <= 3 && c.ranks == vec![0, 1]));
}

/// A memory cgroup of its own below this process's, limited to `limit`
/// bytes with no swap, removed when dropped; `None` where this machine
/// has none that this user may make (not root, or no memory controller).
struct MemoryCgroup(std::path::PathBuf);

impl MemoryCgroup {
    fn new(limit: u64) -> Option<Self> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let name = format!("nestor-oom-test-{}", std::process::id());
        // cgroup v1: the memory hierarchy's line; v2: the unified one.
        let v1 = own.lines().find_map(|l| {
            l.strip_prefix(|c: char| c.is_ascii_digit())?.trim_start_matches(|c: char| c.is_ascii_digit()).strip_prefix(":memory:")
        });
        let dir = match v1 {
            Some(rel) => Path::new("/sys/fs/cgroup/memory").join(rel.trim_start_matches('/')).join(&name),
            None => Path::new("/sys/fs/cgroup").join(own.lines().find_map(|l| l.strip_prefix("0::"))?.trim_start_matches('/')).join(&name),
        };
        std::fs::create_dir(&dir).ok()?;
        let group = Self(dir);
        let v1 = group.0.join("memory.limit_in_bytes").exists();
        let limits: Vec<(&str, String)> = if v1 {
            vec![("memory.limit_in_bytes", limit.to_string()), ("memory.memsw.limit_in_bytes", limit.to_string())]
        } else {
            vec![("memory.max", limit.to_string()), ("memory.swap.max", "0".to_string())]
        };
        for (i, (file, value)) in limits.iter().enumerate() {
            let path = group.0.join(file);
            // The first limit must hold; the swap one exists only where swap is accounted.
            if std::fs::write(&path, value).is_err() && (i == 0 || path.exists()) {
                return None;
            }
        }
        Some(group)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Empty once its processes are gone; a cgroup directory is removed with rmdir.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

#[test]
fn a_rank_ended_by_the_out_of_memory_killer_is_named_so() {
    // The whole run (driver and ranks) in a 256 MiB memory cgroup; one rank
    // fills 1 GiB, and the kernel kills it.
    let Some(group) = MemoryCgroup::new(256 << 20) else {
        eprintln!(
            "no memory cgroup can be made here (needs root and a memory controller); the counter logic is unit-tested in trainer::groups"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let space = "x = 0.5\nsteps = 4\nsleep_ms = 50\nfail_at = 2\nhog_mb = 1024";
    write(dir.path(), &sweep("oom", "", space, "num_workers = 2"));
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
        .arg(&group.0)
        .arg(nestor_bin())
        .args(["run", "sweep.toml", "--storage", "runs", "--plain"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let grid = ResultGrid::load(&dir.path().join("runs/oom")).unwrap();
    let t = grid.get("trial_00000").unwrap();
    assert_eq!(t.status, TrialStatus::Error, "{text}");
    let failure = t.error.as_deref().unwrap_or_default();
    assert!(failure.starts_with("rank 0 was killed by the kernel's out-of-memory killer (signal 9)"), "{failure}\n{text}");
    assert!(text.contains("out-of-memory killer"), "the console says so too: {text}");
    assert_eq!(iterations(&grid, "trial_00000"), vec![1], "what was reported before stays");
    assert!(processes_mentioning(&dir.path().display().to_string()).is_empty(), "a worker survived");
}
