//! Population-based training with real worker processes: after an exploit
//! the recipient continues from the donor's iteration and state (the
//! `acc` the fixture carries in its checkpoint), with the explored config;
//! a trial that never commits a checkpoint is never a donor; `num_to_keep
//! = 1` breaks nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;
use search::TrialResult;

fn pbt_sweep(name: &str, extra_space: &str, extra_scheduler: &str) -> String {
    pbt_sweep_in(name, "", extra_space, extra_scheduler)
}

fn pbt_sweep_in(name: &str, extra_experiment: &str, extra_space: &str, extra_scheduler: &str) -> String {
    population_sweep(name, extra_experiment, extra_space, &format!("type = \"pbt\"\n{extra_scheduler}\n[scheduler.hyperparam_mutations]"))
}

/// Four trials of 12 steps, checkpointing every step (one kept), ranked
/// every 3 steps by `scheduler` (its type, settings and explored table's header).
fn population_sweep(name: &str, extra_experiment: &str, extra_space: &str, scheduler: &str) -> String {
    sweep(
        name,
        &format!("num_samples = 1\nmax_concurrent_trials = 4\nseed = 11\n{extra_experiment}"),
        &format!("x = {{ grid = [0.3, 0.8, 0.9, 0.95] }}\nsteps = 12\nsleep_ms = 40\ncheckpoint = true\n{extra_space}"),
        &format!(
            "\n[checkpoint]\nfrequency = 1\nnum_to_keep = 1\n\n[scheduler]\ntime_attr = \"training_iteration\"\n\
             perturbation_interval = 3\n{scheduler}\nx = {{ uniform = [0.0, 1.0] }}\n"
        ),
    )
}

fn loss(x: f64, step: u64) -> f64 {
    (x - 0.3).powi(2) + 1.0 / step as f64
}

fn store(exp: &Path) -> tuner::store::Store {
    tuner::store::Store::open_existing(&exp.join("store")).unwrap()
}

#[test]
fn an_exploited_trial_continues_from_its_donors_iteration_and_state_with_the_explored_config() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &pbt_sweep("pbt", "", ""));
    let run = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]);
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    let stdout = ok(run);
    assert!(stdout.contains("4 trials (4 TERMINATED)"), "{stdout}");
    let exp = dir.path().join("runs/pbt");
    let store = store(&exp);
    let exploits = store.exploits().unwrap();
    assert!(!exploits.is_empty(), "no exploit happened: {stdout}");
    check_population(&exp, &store, &exp);
    // The exploits are shown by `nestor status` and listed by `nestor exploits`.
    drop(store);
    let status = ok(nestor(dir.path(), &["status", "runs/pbt"]));
    assert!(status.contains(&format!("Exploits: {}", exploits.len())), "{status}");
    let listed = ok(nestor(dir.path(), &["exploits", "runs/pbt"]));
    assert_eq!(listed.lines().count(), exploits.len(), "{listed}");
    let first = &exploits[0];
    assert!(
        listed.lines().next().unwrap().starts_with(&format!("{} at iter {} <- {} ", first.trial_id, first.iteration, first.donor)),
        "{listed}"
    );
    let json = ok(nestor(dir.path(), &["exploits", "runs/pbt", "--json"]));
    let parsed: Vec<serde_json::Value> = json.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(parsed[0]["donor_checkpoint"], first.donor_checkpoint.as_str());
    // The run printed each exploit as it happened.
    assert!(stderr.contains(&format!("{} exploits {}", first.trial_id, first.donor)), "{stderr}");
}

#[test]
fn a_trial_without_a_committed_checkpoint_is_never_a_donor() {
    let dir = tempfile::tempdir().unwrap();
    // trial_00000 (x = 0.3) is the best and never checkpoints; with a top half
    // of two, the other top trial is the only possible donor.
    write(dir.path(), &pbt_sweep("nockpt", "no_checkpoint_trial = \"trial_00000\"", "quantile_fraction = 0.5"));
    let stdout = ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]));
    assert!(stdout.contains("4 trials (4 TERMINATED)"), "{stdout}");
    let store = store(&dir.path().join("runs/nockpt"));
    assert!(store.checkpoints("trial_00000").unwrap().is_empty());
    let exploits = store.exploits().unwrap();
    assert!(!exploits.is_empty(), "no exploit happened: {stdout}");
    for e in &exploits {
        assert_ne!(e.donor, "trial_00000", "{e:?}");
    }
}

/// What must hold of a finished PBT sweep, however it was interrupted: each
/// exploit's recipient continued from its donor's iteration and state with
/// the explored config; each trial's config is its last exploit's; its
/// history runs 1..=12, skipping only to a donor's iteration; one checkpoint
/// is kept, in the storage too (`storage`: the experiment's directory there).
fn check_population(exp: &Path, store: &tuner::store::Store, storage: &Path) {
    let exploits = store.exploits().unwrap();
    let results = store.all_results().unwrap();
    for e in &exploits {
        // The donor's result that carried the checkpoint it handed over.
        let donor: &TrialResult = results[&e.donor]
            .iter()
            .rev()
            .find(|r| r.checkpoint.as_deref() == Some(e.donor_checkpoint.as_str()) && r.metrics["timestamp"] <= e.at)
            .unwrap_or_else(|| panic!("{e:?}: the donor never reported that checkpoint"));
        assert_eq!(donor.training_iteration, e.donor_iteration, "{e:?}");
        // The recipient's first result after the exploit continues the donor's
        // state (unless the donor's checkpoint was of the last step: then none follows).
        let k = e.donor_iteration;
        let next = results[&e.trial_id].iter().find(|r| r.metrics["timestamp"] > e.at);
        let Some(next) = next.filter(|_| k < 12) else {
            assert!(k == 12 && next.is_none_or(|r| r.training_iteration < 12), "{e:?}: the recipient never reported after its exploit");
            continue;
        };
        assert_eq!(next.training_iteration, k + 1, "{e:?}: {next:?}");
        let x = e.new_config["x"].as_f64().unwrap();
        let expected = loss(x, k + 1);
        assert!((next.metrics["loss"] - expected).abs() < 1e-9, "{e:?}: loss {} != {expected}", next.metrics["loss"]);
        assert!(
            (next.metrics["acc"] - (donor.metrics["acc"] + expected)).abs() < 1e-9,
            "{e:?}: acc {} does not continue the donor's {}",
            next.metrics["acc"],
            donor.metrics["acc"]
        );
        assert!((0.0..1.0).contains(&x), "{e:?}: explored x outside its domain");
    }
    for t in store.trials().unwrap() {
        assert_eq!(t.status, tuner::TrialStatus::Terminated, "{}", t.id);
        if let Some(last) = exploits.iter().rev().find(|e| e.trial_id == t.id) {
            assert_eq!(t.config, last.new_config, "{}", t.id);
            let params: serde_json::Value = serde_json::from_str(&read(&exp.join(format!("trials/{}/params.json", t.id)))).unwrap();
            assert_eq!(params, last.new_config, "{}", t.id);
        }
        assert_eq!(t.exploits as usize, exploits.iter().filter(|e| e.trial_id == t.id).count(), "{}", t.id);
        let history: Vec<u64> = tuner::store::effective_history(results[&t.id].clone()).iter().map(|r| r.training_iteration).collect();
        // Iterations 1..=12 in order; a jump only where an exploit took a donor's later checkpoint.
        // It ends at 12, unless it last took a donor's checkpoint of step 12 (nothing was left to run).
        let took_the_end = exploits.iter().rev().find(|e| e.trial_id == t.id).is_some_and(|e| e.donor_iteration == 12);
        assert_eq!(history.first(), Some(&1), "{}: {history:?}", t.id);
        assert!(history.last() == Some(&12) || took_the_end, "{}: {history:?}", t.id);
        for w in history.windows(2) {
            let jumped_by_exploit = exploits.iter().any(|e| e.trial_id == t.id && e.donor_iteration + 1 == w[1]);
            assert!(w[1] == w[0] + 1 || (w[1] > w[0] && jumped_by_exploit), "{}: {history:?}", t.id);
        }
        // num_to_keep = 1: one committed checkpoint left, and one on disk.
        let committed = store.checkpoints(&t.id).unwrap();
        assert_eq!(committed.len(), 1, "{}: {committed:?}", t.id);
        let on_disk: Vec<String> = std::fs::read_dir(storage.join(format!("trials/{}", t.id)))
            .unwrap()
            .flatten()
            .filter(|e| holds_files(&e.path()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("checkpoint_"))
            .collect();
        assert_eq!(on_disk.len(), 1, "{}: {on_disk:?}", t.id);
        // Marked committed, a copy from a donor too.
        let marker = storage.join(format!("trials/{}/{}/.committed", t.id, on_disk[0]));
        assert!(marker.is_file(), "{}: {} has no commit marker", t.id, on_disk[0]);
    }
}

/// Whether a file lies anywhere below `dir` (an object store's files may
/// leave empty directories behind when deleted).
fn holds_files(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| entries.flatten().any(|e| e.path().is_file() || holds_files(&e.path())))
}

#[test]
fn killed_twice_and_resumed_the_population_is_as_consistent() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &pbt_sweep("killed", "", ""));
    let exp = dir.path().join("runs/killed");
    // Kill the driver once the trials have reported `n` results in all.
    let count = |exp: &Path| (0..4).map(|i| read(&exp.join(format!("trials/trial_{i:05}/result.jsonl"))).lines().count()).sum::<usize>();
    let reported = |n: usize| {
        let exp = exp.clone();
        move || count(&exp) >= n
    };
    let mut child = spawn_run(dir.path());
    wait_for_run("16 results", 60.0, &mut child, reported(16));
    signal(child.id(), libc::SIGKILL);
    child.wait().unwrap();
    let exp = dir.path().join("runs/killed");
    wait_for("the workers to exit", 10.0, || processes_mentioning(&exp.display().to_string()).is_empty());
    let mut child = spawn_nestor(dir.path(), &["resume", &exp.display().to_string(), "--plain"], &[]);
    wait_for_run("32 results", 60.0, &mut child, reported(32));
    signal(child.id(), libc::SIGKILL);
    child.wait().unwrap();
    wait_for("the workers to exit", 10.0, || processes_mentioning(&exp.display().to_string()).is_empty());
    let stdout = ok(nestor(dir.path(), &["resume", &exp.display().to_string(), "--plain"]));
    assert!(stdout.contains("4 trials (4 TERMINATED)"), "{stdout}");
    let store = store(&exp);
    assert!(!store.exploits().unwrap().is_empty(), "no exploit happened");
    check_population(&exp, &store, &exp);
}

/// PBT with checkpoints in S3 (a server on loopback): the donor's shards are
/// copied inside the bucket, and the recipient restores from a download of
/// the copy, continuing the donor's state.
#[test]
fn exploits_copy_checkpoints_inside_an_object_store() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&dir.path().join("s3"));
    write(dir.path(), &pbt_sweep_in("pbts3", "storage = \"s3://bucket/runs\"\nlocal_dir = \"local\"", "", ""));
    let stdout = ok(nestor_env(dir.path(), &["run", "sweep.toml", "--plain"], &s3.env()));
    assert!(stdout.contains("4 trials (4 TERMINATED)"), "{stdout}");
    let exp = dir.path().join("local/pbts3");
    let store = store(&exp);
    let exploits = store.exploits().unwrap();
    assert!(!exploits.is_empty(), "no exploit happened: {stdout}");
    for e in &exploits {
        assert!(e.checkpoint.starts_with(&format!("s3://bucket/runs/pbts3/trials/{}/checkpoint_", e.trial_id)), "{e:?}");
        assert!(e.donor_checkpoint.starts_with(&format!("s3://bucket/runs/pbts3/trials/{}/", e.donor)), "{e:?}");
    }
    check_population(&exp, &store, &s3.root.join("bucket/runs/pbts3"));
    // The kept copy of a recipient that exploited last holds its shard and its commit marker.
    let last = exploits.last().unwrap();
    let kept = store.checkpoints(&last.trial_id).unwrap();
    let rel = kept[0].uri.strip_prefix("s3://bucket/").unwrap();
    let objects = s3.objects(rel);
    assert!(objects.iter().any(|o| o.ends_with("rank-0/state.json")), "{objects:?}");
    assert!(objects.iter().any(|o| o.ends_with(".committed")), "{objects:?}");
}

/// PB2 from TOML (Ray's `[low, high]` bounds), with real processes: the
/// same guarantees as PBT's, with explored values inside the bounds.
#[test]
fn pb2_exploits_continue_the_donors_state_with_values_in_bounds() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &population_sweep("pb2", "", "", "type = \"pb2\"\n[scheduler.hyperparam_bounds]"));
    let stdout = ok(nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--plain"]));
    assert!(stdout.contains("4 trials (4 TERMINATED)"), "{stdout}");
    let exp = dir.path().join("runs/pb2");
    let store = store(&exp);
    let exploits = store.exploits().unwrap();
    assert!(!exploits.is_empty(), "no exploit happened: {stdout}");
    check_population(&exp, &store, &exp);
    // PB2 picks new values (not the donor's, bar chance) by its model.
    assert!(exploits.iter().any(|e| e.new_config["x"] != e.old_config["x"]), "{exploits:?}");
    let state = &store.meta("scheduler").unwrap().unwrap()["scheduler"];
    assert_eq!(state["kind"], "pb2");
    assert!(!state["observations"].as_array().unwrap().is_empty(), "{state}");
}
