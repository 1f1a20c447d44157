//! The PyTorch example for real: a Python environment with torch, grpcio and
//! the `nestor` client (created once by `examples/torch_ddp/venv.sh` and
//! cached outside the checkout), then `nestor run examples/torch_ddp/sweep.toml`
//! with 2 DistributedDataParallel workers (gloo) per trial.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The virtualenv's directory (created on first use; several GB the first time).
fn venv() -> &'static Path {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let out = Command::new("bash").arg(repo().join("examples/torch_ddp/venv.sh")).output().expect("run venv.sh");
        assert!(out.status.success(), "examples/torch_ddp/venv.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// `nestor ARGS` from the repository root, with the virtualenv first on PATH.
fn nestor_in_venv(args: &[&str]) -> Command {
    let path = format!("{}:{}", venv().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let mut c = Command::new(nestor_bin());
    c.args(args).current_dir(repo()).env("PATH", path);
    c
}

/// (epoch -> param_sum) from one rank's log, and whether it joined a 2-rank group.
fn rank_log(exp: &Path, trial: &str, rank: u32) -> (BTreeMap<u64, String>, String) {
    let log = std::fs::read_to_string(exp.join(format!("trials/{trial}/logs/rank-{rank}.log"))).unwrap();
    let mut sums = BTreeMap::new();
    for line in log.lines().filter(|l| l.starts_with("epoch ")) {
        let epoch: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let sum = line.rsplit("param_sum=").next().unwrap().to_string();
        sums.insert(epoch, sum);
    }
    (sums, log)
}

#[test]
fn the_ddp_sweep_runs_with_both_ranks_in_one_process_group_and_in_sync() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().display().to_string();
    let out = nestor_in_venv(&["run", "examples/torch_ddp/sweep.toml", "--storage", &storage, "--plain"]).output().unwrap();
    let stdout = ok(out);
    assert!(stdout.contains("4 trials (4 TERMINATED)"), "{stdout}");
    let exp = dir.path().join("torch-ddp");
    for t in 0..4 {
        let trial = format!("trial_{t:05}");
        let (sums0, log0) = rank_log(&exp, &trial, 0);
        let (sums1, log1) = rank_log(&exp, &trial, 1);
        for log in [&log0, &log1] {
            assert!(log.contains("process group world=2 backend=gloo rank_sum=3"), "{trial}: {log}");
        }
        assert_eq!(sums0.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 4], "{trial}: {log0}");
        assert_eq!(sums0, sums1, "{trial}: the ranks' parameters differ after some epoch");
        // Each rank trained on its own shard (DistributedSampler): their training losses differ.
        let losses = |log: &str| -> Vec<String> {
            log.lines().filter_map(|l| l.split("train_loss=").nth(1).and_then(|r| r.split_whitespace().next()).map(String::from)).collect()
        };
        assert_ne!(losses(&log0), losses(&log1), "{trial}: both ranks saw the same batches");
        // Rank 0's checkpoint scratch is gone once the trial ends.
        let left: Vec<_> = std::fs::read_dir(exp.join("trials").join(&trial))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".scratch-"))
            .collect();
        assert!(left.is_empty(), "{trial}: {left:?} left behind");
    }
    let rows = export(dir.path(), &format!("{storage}/torch-ddp"));
    assert_eq!(rows.len(), 16, "4 trials x 4 epochs, one result per step");
    let best: serde_json::Value = serde_json::from_str(&ok(nestor(dir.path(), &["best", "torch-ddp", "--json"]))).unwrap();
    let ckpt = best["checkpoint"].as_str().unwrap();
    assert!(ckpt.ends_with("checkpoint_000004"), "{ckpt}");
    assert!(Path::new(ckpt).join("rank-0/state.pt").is_file());
}

#[test]
fn an_interrupted_ddp_trial_resumes_both_ranks_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().display().to_string();
    let mut child = nestor_in_venv(&[
        "run",
        "examples/torch_ddp/sweep.toml",
        "--storage",
        &storage,
        "--plain",
        "--set",
        "experiment.num_samples=1",
        "--set",
        "experiment.name=ddp-resume",
        "--set",
        "space.epochs=6",
        "--set",
        "stop.training_iteration=6",
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let exp = dir.path().join("ddp-resume");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !exp.join("trials/trial_00000/checkpoint_000002").exists() {
        assert!(std::time::Instant::now() < deadline, "no checkpoint after 120 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    signal(child.id(), libc::SIGINT);
    assert_eq!(child.wait().unwrap().code(), Some(130));
    let grid = tuner::ResultGrid::load(&exp).unwrap();
    let trial = grid.get("trial_00000").unwrap();
    assert_eq!(trial.status.as_str(), "PENDING");
    let resumed_from = std::path::PathBuf::from(trial.checkpoint().unwrap());
    let done = resumed_from.file_name().unwrap().to_string_lossy()["checkpoint_".len()..].parse::<u64>().unwrap();
    assert!(done < 6, "the trial finished before the interrupt");

    let out = nestor_in_venv(&["resume", &exp.display().to_string(), "--plain"]).output().unwrap();
    let stdout = ok(out);
    assert!(stdout.contains("1 trial (1 TERMINATED)"), "{stdout}");
    for rank in 0..2 {
        let (sums, log) = rank_log(&exp, "trial_00000", rank);
        // Rank 1 saved no shard: it resumes from rank 0's.
        let expected = format!("rank {rank}: resumed from {}/rank-0 after epoch {done}", resumed_from.display());
        assert!(log.contains(&expected), "{expected}\n{log}");
        assert_eq!(sums.keys().max(), Some(&6));
    }
    let grid = tuner::ResultGrid::load(&exp).unwrap();
    let iters: Vec<u64> = grid.get("trial_00000").unwrap().history.iter().map(|r| r.training_iteration).collect();
    assert_eq!(iters, (1..=6).collect::<Vec<_>>(), "results after the checkpoint are superseded, not doubled");
}

#[test]
fn bad_reports_from_python_are_refused_clearly_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let script = repo().join("tests/py/bad_reports.py");
    let python = venv().join("bin/python");
    std::fs::write(
        dir.path().join("sweep.toml"),
        format!(
            "[experiment]\nname = \"bad\"\nmetric = \"loss\"\nmode = \"min\"\n\n[space]\nx = 1\n\n[trainer]\ncommand = [\"{}\", \"{}\"]\n",
            python.display(),
            script.display()
        ),
    )
    .unwrap();
    let stdout = ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]));
    assert!(stdout.contains("1 trial (1 TERMINATED)"), "{stdout}");
    let log = std::fs::read_to_string(dir.path().join("runs/bad/trials/trial_00000/logs/rank-0.log")).unwrap();
    assert_eq!(log.matches("refused: ").count(), 8, "{log}");
    assert!(log.contains("done"), "{log}");
    let rows = export(dir.path(), "runs/bad");
    assert_eq!(rows.len(), 2, "only the good reports are stored: {rows:?}");
    assert_eq!(rows[0]["loss"], "NaN");
    assert_eq!((rows[1]["loss"].as_f64(), rows[1]["extra"].as_f64()), (Some(1.0), Some(2.0)));
    // Values that are not numbers are kept with the result, as reported.
    assert_eq!(
        (&rows[1]["note"], &rows[1]["sizes"], &rows[1]["flags"]),
        (&serde_json::json!("ok"), &serde_json::json!([1, 2]), &serde_json::json!({"warm": true}))
    );
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_ddp_rank_killed_mid_epoch_is_restarted_and_the_trial_ends_as_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().display().to_string();
    let args = |name: &'static str| {
        vec![
            "run".to_string(),
            "examples/torch_ddp/sweep.toml".into(),
            "--storage".into(),
            storage.clone(),
            "--plain".into(),
            "--set".into(),
            "experiment.num_samples=1".into(),
            "--set".into(),
            format!("experiment.name={name}"),
            "--set".into(),
            "space.epochs=6".into(),
            "--set".into(),
            "stop.training_iteration=6".into(),
            "--set".into(),
            "failure.max_failures=1".into(),
        ]
    };
    let (faulty, reference) = (args("ddp-kill"), args("ddp-ref"));
    let mut child =
        nestor_in_venv(&strs(&faulty)).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let exp = dir.path().join("ddp-kill");
    let trial_dir = exp.join("trials/trial_00000");
    wait_for_run("checkpoint 2 committed", 120.0, &mut child, || trial_dir.join("checkpoint_000002/.committed").exists());
    let victim = rank_pid(&trial_dir, 1).expect("rank 1 is running");
    let killed_at = std::time::Instant::now();
    signal(victim, libc::SIGKILL);
    // Back: both ranks of a new group running (new pids).
    wait_for("a new group", 10.0, || {
        let (r0, r1) = (rank_pid(&trial_dir, 0), rank_pid(&trial_dir, 1));
        r1.is_some_and(|p| p != victim) && r0.is_some()
    });
    let back = killed_at.elapsed().as_secs_f64();
    eprintln!("failover: the group was back {:.0} ms after the kill", back * 1e3);
    assert!(back < 2.0, "the DDP group took {back:.2} s to come back");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("trial_00000: rank 1 was killed by signal 9; log: "), "{text}");
    assert!(text.contains("rank-1.log; restarting from checkpoint_00000"), "{text}");

    ok(nestor_in_venv(&strs(&reference)).output().unwrap());
    let faulty = tuner::ResultGrid::load(&exp).unwrap();
    let reference = tuner::ResultGrid::load(&dir.path().join("ddp-ref")).unwrap();
    let (f, r) = (faulty.get("trial_00000").unwrap(), reference.get("trial_00000").unwrap());
    assert_eq!((f.failures, f.restarts, r.failures), (1, 1, 0));
    let iters: Vec<u64> = f.history.iter().map(|x| x.training_iteration).collect();
    assert_eq!(iters, (1..=6).collect::<Vec<_>>());
    // Deterministic training restored from the checkpoint: the same numbers, to the bit.
    for key in ["val_loss", "train_loss"] {
        let (a, b) = (f.metrics.as_ref().unwrap()[key], r.metrics.as_ref().unwrap()[key]);
        assert_eq!(a, b, "{key}: restarted {a} vs uninterrupted {b}");
    }
    let (sums_f, _) = rank_log(&exp, "trial_00000", 1);
    let (sums_r, _) = rank_log(&dir.path().join("ddp-ref"), "trial_00000", 1);
    assert_eq!(sums_f.get(&6), sums_r.get(&6), "rank 1's parameters after epoch 6");
    assert!(processes_mentioning(&storage).is_empty(), "a worker survived");
}

/// The DDP example with each scheduler from TOML (`--set scheduler...`):
/// every trial ends, and a trial that was paused resumes both ranks from its
/// checkpoint and goes on at the next epoch.
#[test]
fn the_ddp_sweep_runs_with_each_scheduler_and_paused_trials_resume_their_ranks_from_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().display().to_string();
    let schedulers: [(&str, &[&str]); 4] = [
        ("asha", &["scheduler.type=\"asha\"", "scheduler.max_t=4", "scheduler.reduction_factor=2"]),
        (
            "asha-promotion",
            &["scheduler.type=\"asha\"", "scheduler.asha_type=\"promotion\"", "scheduler.max_t=4", "scheduler.reduction_factor=2"],
        ),
        ("hyperband", &["scheduler.type=\"hyperband\"", "scheduler.max_t=4", "scheduler.reduction_factor=2"]),
        ("median", &["scheduler.type=\"median_stopping\"", "scheduler.min_samples_required=1"]),
    ];
    for (name, sets) in schedulers {
        let mut args = vec!["run", "examples/torch_ddp/sweep.toml", "--storage", &storage, "--plain"];
        let exp_name = format!("experiment.name=\"ddp-{name}\"");
        for s in sets.iter().copied().chain(["checkpoint.frequency=1", exp_name.as_str()]) {
            args.extend(["--set", s]);
        }
        let stdout = ok(nestor_in_venv(&args).output().unwrap());
        assert!(stdout.contains("4 trials (4 TERMINATED)"), "{name}: {stdout}");
        let exp = dir.path().join(format!("ddp-{name}"));
        let grid = tuner::ResultGrid::load(&exp).unwrap();
        let lengths: Vec<usize> = grid.iter().map(|t| t.history.len()).collect();
        assert!(lengths.iter().any(|&n| n < 4), "{name} stopped no trial early: {lengths:?}");
        let store = tuner::store::Store::open_existing(&exp.join("store")).unwrap();
        for (id, results) in store.all_results().unwrap() {
            let its: Vec<u64> = results.iter().map(|r| r.training_iteration).collect();
            assert_eq!(its, (1..=its.len() as u64).collect::<Vec<_>>(), "{name} {id}: an epoch ran twice or was skipped");
        }
        let resumed: Vec<&tuner::TrialOutcome> = grid.iter().filter(|t| t.resumes > 0).collect();
        if name == "hyperband" {
            // Four trials in one bracket: at least one survivor of rung 1 paused there (only the last to arrive goes straight on).
            assert!(!resumed.is_empty(), "{name}: no paused trial resumed");
        }
        for t in resumed {
            for rank in 0..2 {
                let (sums, log) = rank_log(&exp, &t.trial_id, rank);
                // Each run after a pause starts from the checkpoint of the epoch it paused at.
                let resumes: Vec<u64> = log
                    .lines()
                    .filter_map(|l| l.strip_prefix(&format!("rank {rank}: resumed from ")))
                    .map(|l| l.rsplit("after epoch ").next().unwrap().parse().unwrap())
                    .collect();
                assert_eq!(resumes.len() as u32, t.resumes, "{name} {}: {log}", t.trial_id);
                for e in &resumes {
                    assert!(log.contains(&format!("checkpoint_{e:06}/rank-0 after epoch {e}")), "{log}");
                    assert!(sums.contains_key(&(e + 1)), "{name} {}: nothing trained after epoch {e}: {log}", t.trial_id);
                }
                assert_eq!(sums.keys().copied().collect::<Vec<_>>(), (1..=t.history.len() as u64).collect::<Vec<_>>());
            }
        }
    }
}

/// `resource_changing`: of two 1-worker DDP trials, the short one ends, and
/// the long one restarts from its checkpoint with 2 ranks; from then on
/// both ranks join one gloo process group and stay in sync, and no epoch
/// runs twice.
#[test]
fn a_ddp_trial_grows_from_one_to_two_ranks_and_its_process_group_follows() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().display().to_string();
    let out = nestor_in_venv(&[
        "run",
        "examples/torch_ddp/sweep.toml",
        "--storage",
        &storage,
        "--plain",
        "--set",
        "experiment.name=ddp-grow",
        "--set",
        "experiment.num_samples=1",
        "--set",
        "space.epochs={ grid = [1, 300] }",
        "--set",
        "stop.training_iteration=300",
        "--set",
        "trainer.num_workers=1",
        "--set",
        "resources.CPU=2",
        "--set",
        "checkpoint.frequency=1",
        "--set",
        "scheduler.type=resource_changing",
    ])
    .output()
    .unwrap();
    let stdout = ok(out);
    assert!(stdout.contains("2 trials (2 TERMINATED)"), "{stdout}");
    let exp = dir.path().join("ddp-grow");
    let grid = tuner::ResultGrid::load(&exp).unwrap();
    // An epoch takes some 20 ms: the long trial is still training when the short one ends.
    let long = grid.iter().find(|t| t.config["epochs"] == 300).unwrap();
    assert_eq!(long.resources.len(), 2, "{long:?}");
    let iters: Vec<u64> = long.history.iter().map(|r| r.training_iteration).collect();
    assert_eq!(iters, (1..=300).collect::<Vec<_>>());
    let (sums0, log0) = rank_log(&exp, &long.trial_id, 0);
    let (sums1, log1) = rank_log(&exp, &long.trial_id, 1);
    let world = |log: &str, epoch: u64| {
        log.lines()
            .find(|l| l.starts_with(&format!("epoch {epoch} rank ")))
            .map(|l| l.split(':').next().unwrap().rsplit('/').next().unwrap().to_string())
    };
    // Rank 0 ran on its own up to some epoch k, then in a world of 2; rank 1 joined from k + 1, resuming rank 0's shard.
    let k = (1..=300).take_while(|e| world(&log0, *e).as_deref() == Some("1")).count() as u64;
    assert!((1..300).contains(&k), "{log0}");
    for e in k + 1..=300 {
        assert_eq!(world(&log0, e).as_deref(), Some("2"), "epoch {e}: {log0}");
        assert_eq!(world(&log1, e).as_deref(), Some("2"), "epoch {e}: {log1}");
        assert_eq!(sums0[&e], sums1[&e], "epoch {e}: the ranks' parameters differ");
    }
    assert!(log1.contains("rank 1: resumed from ") && log1.contains(&format!("/rank-0 after epoch {k}")), "{log1}");
    for log in [&log0, &log1] {
        assert!(log.contains("process group world=2 backend=gloo rank_sum=3"), "{log}");
    }
}

/// The same sweep inside a 2-node Slurm allocation: every trial's two
/// ranks run on different nodes (as one job step), form one gloo process
/// group across them, and stay in sync epoch by epoch. Each node has its
/// own network namespace and address: gloo connects the ranks, and they
/// report to the driver, across a network, not loopback.
#[test]
fn the_ddp_sweep_spans_two_slurm_nodes_with_its_ranks_in_sync() {
    let options = common::slurm::Options { networks: true, ..Default::default() };
    let cluster = common::slurm::SlurmCluster::start_with(2, 2, 4000, options);
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().display().to_string();
    let path = format!("{}:{}", venv().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out = cluster
        .cmd("salloc")
        .args(["-N2", "--ntasks-per-node=2", "--mem=3000"])
        .arg(nestor_bin())
        .args(["run", "examples/torch_ddp/sweep.toml", "--storage", &storage, "--plain"])
        .args(["--set", "experiment.num_samples=2", "--set", "trainer.placement_strategy=\"STRICT_SPREAD\""])
        .current_dir(repo())
        .env("PATH", path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = ok(out);
    assert!(stdout.contains("2 trials (2 TERMINATED)"), "{stdout}\n{stderr}");
    assert!(stderr.contains("nestor: Slurm job "), "{stderr}");
    let exp = dir.path().join("torch-ddp");
    for t in 0..2 {
        let trial = format!("trial_{t:05}");
        let (sums0, log0) = rank_log(&exp, &trial, 0);
        let (sums1, log1) = rank_log(&exp, &trial, 1);
        let node = |log: &str, rank: u32| {
            let line = log.lines().find(|l| l.starts_with(&format!("nestor: rank {rank} of 2 on "))).unwrap_or_else(|| panic!("{log}"));
            line.split(" on ").nth(1).unwrap().split(' ').next().unwrap().to_string()
        };
        assert_ne!(node(&log0, 0), node(&log1, 1), "{trial}: both ranks on one node");
        for log in [&log0, &log1] {
            assert!(log.contains("process group world=2 backend=gloo rank_sum=3"), "{trial}: {log}");
        }
        assert_eq!(sums0.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 4], "{trial}: {log0}");
        assert_eq!(sums0, sums1, "{trial}: the ranks' parameters differ after some epoch");
    }
}

/// The DDP example on two Slurm nodes that share no directory with the
/// driver (each sees an empty directory of its own where the experiment
/// is), its checkpoints in S3: rank 0 ships its shard through the report
/// channel, the ranks meet at a TCP store rank 0 opens on its node (its
/// address passed on by the driver), and after rank 1 is killed both ranks
/// fetch the checkpoint to resume from through the channel. The trial ends
/// with the numbers of an uninterrupted run on one machine, to the bit.
#[test]
fn the_ddp_sweep_on_nodes_sharing_no_directory_ships_its_checkpoints_and_meets_through_the_driver() {
    let hidden = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&dir.path().join("s3"));
    let on_both = vec![(0, hidden.path().to_path_buf()), (1, hidden.path().to_path_buf())];
    let options = common::slurm::Options { networks: true, hidden: on_both, ..Default::default() };
    let cluster = common::slurm::SlurmCluster::start_with(2, 2, 4000, options);
    let local = hidden.path().join("local");
    let sets = |name: &str| {
        ["experiment.num_samples=1", "space.epochs=6", "stop.training_iteration=6", "failure.max_failures=1"]
            .into_iter()
            .map(String::from)
            .chain([format!("experiment.name=\"{name}\"")])
            .flat_map(|s| ["--set".to_string(), s])
            .collect::<Vec<String>>()
    };
    let path = format!("{}:{}", venv().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let mut child = cluster
        .cmd("salloc")
        .args(["-N2", "--ntasks-per-node=2", "--mem=3000"])
        .arg(nestor_bin())
        .args(["run", "examples/torch_ddp/sweep.toml", "--plain"])
        .args(sets("ddp-shipped"))
        .args(["--set", "trainer.placement_strategy=\"STRICT_SPREAD\"", "--set", "experiment.storage=\"s3://bucket/runs\""])
        .arg("--set")
        .arg(format!("experiment.local_dir=\"{}\"", local.display()))
        .current_dir(repo())
        .env("PATH", path)
        .envs(s3.env())
        .env("NESTOR_LOG", "warn,trainer::service=info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exp = local.join("ddp-shipped");
    let trial_dir = exp.join("trials/trial_00000");
    let committed = s3.root.join("bucket/runs/ddp-shipped/trials/trial_00000/checkpoint_000002/.committed");
    wait_for_run("checkpoint 2 committed in the bucket", 120.0, &mut child, || committed.exists());
    let victim = rank_pid(&trial_dir, 1).expect("rank 1 is running");
    signal(victim, libc::SIGKILL);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = ok(out);
    assert!(stdout.contains("1 trial (1 TERMINATED)"), "{stdout}\n{stderr}");
    assert!(stderr.contains(&format!("{} is not shared with node1, node2", exp.display())), "{stderr}");
    assert!(stderr.contains("rank 1 (on node2) was killed"), "{stderr}");
    // Each run's rank 0 posted its store's address (on its node) through the driver.
    let node1 = cluster.node_addr("node1");
    assert_eq!(stderr.matches("rank 0 posted where the ranks meet").count(), 2, "{stderr}");
    assert!(stderr.contains(&format!("address={node1}:")), "{stderr}");
    for rank in 0..2 {
        let (_, log) = rank_log(&exp, "trial_00000", rank);
        assert_eq!(log.matches("process group world=2 backend=gloo rank_sum=3").count(), 2, "two runs met: {log}");
        let resumed = log.lines().find(|l| l.starts_with(&format!("rank {rank}: resumed from "))).unwrap_or_else(|| panic!("{log}"));
        assert!(resumed.contains(&format!("/nestor-trial_00000-rank-{rank}-")), "a copy fetched to the node: {resumed}");
    }
    // The same sweep on one machine, never interrupted.
    let reference = dir.path().join("ref");
    let mut args = vec!["run".to_string(), "examples/torch_ddp/sweep.toml".into(), "--plain".into(), "--storage".into()];
    args.push(reference.display().to_string());
    args.extend(sets("ddp-ref"));
    ok(nestor_in_venv(&strs(&args)).output().unwrap());
    let shipped = tuner::ResultGrid::load(&exp).unwrap();
    let reference = tuner::ResultGrid::load(&reference.join("ddp-ref")).unwrap();
    let (f, r) = (shipped.get("trial_00000").unwrap(), reference.get("trial_00000").unwrap());
    assert_eq!((f.failures, f.restarts), (1, 1));
    assert_eq!(f.history.iter().map(|x| x.training_iteration).collect::<Vec<_>>(), (1..=6).collect::<Vec<_>>());
    for key in ["val_loss", "train_loss"] {
        let (a, b) = (f.metrics.as_ref().unwrap()[key], r.metrics.as_ref().unwrap()[key]);
        assert_eq!(a, b, "{key}: shipped and restarted {a} vs uninterrupted {b}");
    }
    let objects = s3.objects("runs/ddp-shipped/trials/trial_00000/checkpoint_000006");
    assert!(objects.iter().any(|o| o.ends_with("checkpoint_000006/rank-0/state.pt")), "{objects:?}");
    assert!(!trial_dir.join(".incoming").exists());
}

/// The Python client ships a checkpoint tree through the report channel and
/// fetches it back whole (what it does on Slurm nodes that share no
/// directory, asked for here on one machine through `[trainer] env`):
/// nested directories, an empty file, an empty directory and a file of
/// several chunks come back byte for byte after a restart, and the driver
/// keeps no staged copy.
#[test]
fn a_python_checkpoint_tree_is_shipped_and_fetched_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let python = venv().join("bin/python");
    let script = repo().join("tests/py/shipped_tree.py");
    std::fs::write(
        dir.path().join("sweep.toml"),
        format!(
            "[experiment]\nname = \"tree\"\nmetric = \"loss\"\nmode = \"min\"\n\n[space]\nx = 1\n\n[trainer]\ncommand = [\"{}\", \"{}\"]\n\
             env = {{ NESTOR_NODE_VIEW = \"unshared\" }}\n\n[failure]\nmax_failures = 1\n",
            python.display(),
            script.display()
        ),
    )
    .unwrap();
    let stdout = ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]));
    assert!(stdout.contains("1 trial (1 TERMINATED)"), "{stdout}");
    let trial = dir.path().join("runs/tree/trials/trial_00000");
    let log = std::fs::read_to_string(trial.join("logs/rank-0.log")).unwrap();
    assert!(log.contains("dying on purpose at step 3") && log.contains("at step 2: same tree 1.0"), "{log}");
    // From a copy fetched through the channel, not the driver's own directory.
    let resumed = log.lines().find(|l| l.starts_with("resumed from ")).unwrap();
    assert!(resumed.contains("/nestor-trial_00000-rank-0-") && !resumed.contains(&trial.display().to_string()), "{resumed}");
    let rows = export(dir.path(), "runs/tree");
    let last = rows.last().unwrap();
    assert_eq!(
        (last["training_iteration"].as_u64(), last["restored_same"].as_f64(), last["start"].as_f64()),
        (Some(4), Some(1.0), Some(2.0))
    );
    // The driver persisted the shipped tree as it saved it, and staged nothing that stayed.
    let shard = trial.join("checkpoint_000004/rank-0");
    assert_eq!(std::fs::read(shard.join("model/meta/step.txt")).unwrap(), b"4");
    let weights: Vec<u8> = (0..600_000u32).map(|i| ((i * 7 + 4) % 251) as u8).collect();
    assert!(std::fs::read(shard.join("model/weights.bin")).unwrap() == weights, "weights.bin differs from what was saved");
    assert_eq!(std::fs::read(shard.join("empty.txt")).unwrap(), b"");
    assert!(shard.join("logs/none").is_dir());
    assert!(!trial.join(".incoming").exists());
}
