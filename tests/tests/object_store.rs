//! Checkpoints in S3, for real: an S3-compatible server (s3s-fs) on
//! loopback, started and stopped by each test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use tuner::{ResultGrid, TrialStatus};

fn s3_sweep(name: &str, space: &str, extra: &str) -> String {
    sweep(name, "storage = \"s3://bucket/runs\"\nlocal_dir = \"local\"", space, extra)
}

/// The `checkpoint_NNNNNN` names that hold objects in the bucket for a trial.
fn checkpoints_in_bucket(s3: &S3Server, exp: &str, trial: &str) -> Vec<String> {
    let mut names: Vec<String> = s3
        .objects(&format!("runs/{exp}/trials/{trial}"))
        .iter()
        .filter_map(|o| o.split('/').find(|p| p.starts_with("checkpoint_")).map(String::from))
        .collect();
    names.dedup();
    names
}

#[test]
fn checkpoints_upload_commit_keep_n_and_restore_after_a_driver_kill() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&dir.path().join("s3"));
    // Two ranks, both saving shards; keep 1: the best by the highest loss,
    // checkpoint 1, and the latest besides (Ray's rule; not "the newest two").
    let space = "x = 0.5\nsteps = 6\nsleep_ms = 150\ncheckpoint = true\ndump_env = true";
    let extra = "num_workers = 2\n\n[checkpoint]\nnum_to_keep = 1\nscore_attribute = \"loss\"\nscore_order = \"max\"";
    write(dir.path(), &s3_sweep("s3run", space, extra));
    let mut run = spawn_nestor(dir.path(), &["run", "sweep.toml", "--plain"], &s3.env());
    let committed = |k: u32| s3.root.join(format!("bucket/runs/s3run/trials/trial_00000/checkpoint_{k:06}/.committed")).exists();
    wait_for_run("checkpoint 3 committed in the bucket", 30.0, &mut run, || committed(3));
    signal(run.id(), libc::SIGKILL);
    let _ = run.wait();
    let local = dir.path().join("local/s3run");
    wait_for("the workers to follow the driver", 10.0, || processes_mentioning(&dir.path().display().to_string()).is_empty());

    ok(nestor_env(dir.path(), &["resume", "local/s3run", "--plain"], &s3.env()));
    let trial = local.join("trials/trial_00000");
    // Each rank restarted from its own shard, downloaded from the bucket by the rank itself: the driver fetched nothing.
    for r in 0..2 {
        let env: serde_json::Value = serde_json::from_str(&read(&trial.join(format!("rank-{r}.json")))).unwrap();
        let from = env["NESTOR_CHECKPOINT"].as_str().unwrap();
        let own = std::env::temp_dir().join(format!("nestor-trial_00000-rank-{r}-"));
        assert!(from.starts_with(&own.display().to_string()), "{from}");
        assert_eq!(env["plan"]["routes"]["back"]["kind"], "store", "{env}");
        assert!(env["plan"]["routes"]["back"]["uri"]
            .as_str()
            .unwrap()
            .starts_with("s3://bucket/runs/s3run/trials/trial_00000/checkpoint_"));
    }
    assert!(!trial.join("restore").exists(), "the driver downloaded the checkpoint");
    let grid = ResultGrid::load(&local).unwrap();
    let t = grid.get("trial_00000").unwrap();
    assert_eq!(t.status, TrialStatus::Terminated);
    assert_eq!(t.history.iter().map(|r| r.training_iteration).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 6]);
    let acc = (1..=6).fold(0.0, |a, s| a + (0.5f64 - 0.3).powi(2) + 1.0 / s as f64);
    assert_eq!(t.metrics.as_ref().unwrap()["acc"], acc, "the state came back whole from S3");
    // Committed: the latest and the highest-loss one, with every rank's shard.
    let kept: Vec<(u64, &str)> = t.checkpoints.iter().map(|c| (c.iteration, c.uri.as_str())).collect();
    let uri = |k: u32| format!("s3://bucket/runs/s3run/trials/trial_00000/checkpoint_{k:06}");
    assert_eq!(kept, vec![(1, uri(1).as_str()), (6, uri(6).as_str())]);
    assert!(t.checkpoints.iter().all(|c| c.ranks == vec![0, 1] && c.world_size == 2));
    assert_eq!(checkpoints_in_bucket(&s3, "s3run", "trial_00000"), vec!["checkpoint_000001", "checkpoint_000006"]);
    let objects = s3.objects("runs/s3run/trials/trial_00000/checkpoint_000006");
    let names: Vec<&str> = objects.iter().map(|o| o.rsplit("checkpoint_000006/").next().unwrap()).collect();
    assert_eq!(names, vec![".committed", "rank-0/state.json", "rank-1/state.json"]);
    assert!(s3.objects("runs/s3run").contains(&"runs/s3run/experiment.toml".to_string()));
    // `nestor best` names the best checkpoint by the experiment's metric (loss, min): the latest.
    let best: serde_json::Value = serde_json::from_str(&ok(nestor(dir.path(), &["best", "local/s3run", "--json"]))).unwrap();
    assert_eq!(best["checkpoint"], uri(6));
    assert_eq!(best["checkpoints"].as_array().unwrap().len(), 2);
    assert!(processes_mentioning(&dir.path().display().to_string()).is_empty(), "a worker survived");
}

#[test]
fn a_server_killed_mid_upload_fails_the_commit_and_the_previous_checkpoint_stays() {
    let dir = tempfile::tempdir().unwrap();
    let mut s3 = S3Server::start(&dir.path().join("s3"));
    let space = "x = 0.5\nsteps = 3\ncheckpoint = true\nckpt_mb = 256";
    write(dir.path(), &s3_sweep("cut", space, "env = { RUST_BACKTRACE = \"0\" }"));
    let mut run = spawn_nestor(dir.path(), &["run", "sweep.toml", "--plain"], &s3.env());
    let trial = dir.path().join("local/cut/trials/trial_00000");
    wait_for_run("checkpoint 1 committed", 60.0, &mut run, || {
        s3.root.join("bucket/runs/cut/trials/trial_00000/checkpoint_000001/.committed").exists()
    });
    wait_for_run("the second upload to start", 60.0, &mut run, || read(&trial.join("logs/rank-0.log")).contains("checkpointing step 2"));
    s3.kill();
    let out = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the sweep itself goes on: {stderr}");
    // The result store's copy in the bucket falls behind, said once; the local store stays the store of record.
    assert_eq!(stderr.matches("falls behind").count(), 1, "{stderr}");
    let grid = ResultGrid::load(&dir.path().join("local/cut")).unwrap();
    let t = grid.get("trial_00000").unwrap();
    assert_eq!(t.status, TrialStatus::Error);
    let error = t.error.as_deref().unwrap();
    assert!(error.contains("checkpoint transfer s3://bucket/runs/cut/trials/trial_00000/checkpoint_000002/rank-0/"), "{error}");
    assert_eq!(t.history.len(), 1, "step 2 was never a result");
    assert_eq!(t.checkpoints.iter().map(|c| c.iteration).collect::<Vec<_>>(), vec![1], "checkpoint 1 is still the latest");
    assert!(processes_mentioning(&dir.path().display().to_string()).is_empty(), "a worker survived");
}

#[test]
fn an_unreachable_storage_url_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let env: Vec<(String, String)> = [
        ("AWS_ACCESS_KEY_ID", "k".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "s".to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ENDPOINT", format!("http://127.0.0.1:{port}")),
        ("AWS_ALLOW_HTTP", "true".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    write(dir.path(), &s3_sweep("nowhere", "x = 0.5", ""));
    let out = nestor_env(dir.path(), &["run", "sweep.toml", "--plain"], &env);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: storage `s3://bucket/runs/nowhere` is not usable:"), "{stderr}");
    assert!(!dir.path().join("local").exists(), "nothing written");
    // A scheme object_store does not know: refused as a bad key.
    write(dir.path(), &sweep("bad", "storage = \"ftp://host/x\"", "x = 0.5", ""));
    let out = nestor(dir.path(), &["run", "sweep.toml"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("experiment.storage") && stderr.contains("unknown scheme `ftp://`"), "{stderr}");
}

#[test]
fn ranks_upload_their_shards_to_the_bucket_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&dir.path().join("s3"));
    write(dir.path(), &s3_sweep("direct", "x = 0.5\nsteps = 4\ncheckpoint = true", "num_workers = 2"));
    let mut env = s3.env();
    env.push(("NESTOR_LOG".into(), "warn,trainer::intake=debug".into()));
    let out = nestor_env(dir.path(), &["run", "sweep.toml", "--plain"], &env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out);
    let shards: Vec<&str> = stderr.lines().filter(|l| l.contains("checkpoint shard")).collect();
    assert_eq!(shards.len(), 8, "{stderr}");
    assert!(shards.iter().all(|l| l.contains("uploaded by the rank")), "a shard went through the driver:\n{stderr}");
    let objects = s3.objects("runs/direct/trials/trial_00000/checkpoint_000004");
    let names: Vec<&str> = objects.iter().map(|o| o.rsplit("checkpoint_000004/").next().unwrap()).collect();
    assert_eq!(names, vec![".committed", "rank-0/state.json", "rank-1/state.json"]);
    let grid = ResultGrid::load(&dir.path().join("local/direct")).unwrap();
    let t = grid.get("trial_00000").unwrap();
    assert_eq!(t.checkpoints.last().map(|c| (c.iteration, c.ranks.clone())), Some((4, vec![0, 1])));
}

/// With `storage` in a bucket, the result store is there too: `nestor
/// status`, `best` and `export` read it from the bucket in a directory that
/// never saw the sweep; the driver is killed mid-sweep, its local directory
/// deleted, and `nestor resume s3://...` finishes the sweep from the bucket
/// alone, every acknowledged step kept and none run twice.
#[test]
fn the_result_store_lives_in_the_bucket_and_a_sweep_resumes_from_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&dir.path().join("s3"));
    let space = "x = { grid = [0.2, 0.4, 0.6] }\nsteps = 8\nsleep_ms = 150\ncheckpoint = true";
    write(dir.path(), &s3_sweep("alone", space, "num_workers = 1\n\n[checkpoint]\nfrequency = 1"));
    let mut run = spawn_nestor(dir.path(), &["run", "sweep.toml", "--plain"], &s3.env());
    let committed = |t: u32, k: u32| s3.root.join(format!("bucket/runs/alone/trials/trial_0000{t}/checkpoint_{k:06}/.committed")).exists();
    wait_for_run("a few checkpoints committed in the bucket", 30.0, &mut run, || committed(0, 3));
    // Read from elsewhere while it runs: the bucket's store, not the running driver's.
    let status = ok(nestor_env(elsewhere.path(), &["status", "s3://bucket/runs/alone"], &s3.env()));
    assert!(status.contains("alone") && status.contains("trial_00000"), "{status}");
    signal(run.id(), libc::SIGKILL);
    let _ = run.wait();
    wait_for("the workers to follow the driver", 10.0, || processes_mentioning(&dir.path().display().to_string()).is_empty());
    // What the bucket says was stored before the kill.
    let before: Vec<serde_json::Value> =
        ok(nestor_env(elsewhere.path(), &["export", "s3://bucket/runs/alone", "--format", "json"], &s3.env()))
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    assert!(!before.is_empty(), "no result in the bucket's store");
    // Nothing local is left: the sweep goes on from the bucket alone, in another directory.
    std::fs::remove_dir_all(dir.path().join("local")).unwrap();
    let out = nestor_env(elsewhere.path(), &["resume", "s3://bucket/runs/alone", "--plain"], &s3.env());
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = ok(out);
    assert!(stdout.contains("3 trials (3 TERMINATED)"), "{stdout}\n{stderr}");
    assert!(stderr.contains("read back from s3://bucket/runs/alone"), "{stderr}");
    let local = elsewhere.path().join("local/alone");
    let grid = ResultGrid::load(&local).unwrap();
    for t in grid.iter() {
        let its: Vec<u64> = t.history.iter().map(|r| r.training_iteration).collect();
        assert_eq!(its, (1..=8).collect::<Vec<_>>(), "{}", t.trial_id);
        let acc = (1..=8).fold(0.0, |a, s| a + (t.config["x"].as_f64().unwrap() - 0.3).powi(2) + 1.0 / s as f64);
        assert!((t.metrics.as_ref().unwrap()["acc"] - acc).abs() < 1e-9, "{}: the state came back whole", t.trial_id);
    }
    // Every result stored before the kill is still there, the same.
    let after: Vec<serde_json::Value> = ok(nestor_env(dir.path(), &["export", "s3://bucket/runs/alone", "--format", "json"], &s3.env()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for r in &before {
        let same = after
            .iter()
            .any(|a| a["trial_id"] == r["trial_id"] && a["training_iteration"] == r["training_iteration"] && a["loss"] == r["loss"]);
        assert!(same, "lost after the resume: {r}");
    }
    let best: serde_json::Value =
        serde_json::from_str(&ok(nestor_env(dir.path(), &["best", "s3://bucket/runs/alone", "--json"], &s3.env()))).unwrap();
    assert_eq!(best["trial_id"], "trial_00000", "{best}");
    assert!(best["checkpoint"].as_str().unwrap().starts_with("s3://bucket/runs/alone/trials/trial_00000/checkpoint_"), "{best}");
    // The store's objects: a base and the logs after it.
    let objects = s3.objects("runs/alone/store");
    assert!(objects.iter().any(|o| o.contains("/store/base-")), "{objects:?}");
}
