//! The Python driver for real: `pip install ./python` into a new virtualenv
//! (its build makes the `nestor` binary and puts it on the venv's PATH),
//! then Ray-style scripts run with only their imports changed: function
//! trainables with ASHA and checkpoints, warm workers that keep nothing of
//! an earlier trial, a function that raises, bad input refused by key, and
//! `Tuner.restore` after the driver and the binary are killed with -9.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::python::{kill_driver_midway, line, passed, repo, torch_python, torch_venv, trial_iterations, trials};
use common::*;

/// A new virtualenv with `pip install ./python` done (once per test run).
fn venv() -> &'static Path {
    static VENV: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = VENV.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path().join("venv");
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let out = Command::new(&python).args(["-m", "venv"]).arg(&venv).output().expect("python3 -m venv");
        assert!(out.status.success(), "python3 -m venv failed: {}", String::from_utf8_lossy(&out.stderr));
        let out = Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(repo().join("python"))
            .env_remove("NESTOR_BIN")
            .output()
            .expect("pip install ./python");
        assert!(
            out.status.success(),
            "pip install ./python failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (dir, venv)
    });
    path
}

/// `python SCRIPT ARGS` in the venv, from `cwd`, with the venv's `nestor` (no NESTOR_BIN).
fn python(cwd: &Path, script: &str, args: &[&str], env: &[(&str, String)]) -> Output {
    let path = format!("{}:{}", venv().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    Command::new(venv().join("bin/python"))
        .arg(repo().join(script))
        .args(args)
        .current_dir(cwd)
        .env("PATH", path)
        .env_remove("NESTOR_BIN")
        .env("PYTHONPATH", repo().join("tests/py"))
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .output()
        .expect("run the script")
}

#[test]
fn pip_install_puts_the_binary_on_the_venvs_path_and_the_versions_agree() {
    let bin = venv().join("bin/nestor");
    assert!(bin.is_file(), "{} was not installed", bin.display());
    let out = Command::new(&bin).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(version, format!("nestor {}", env!("CARGO_PKG_VERSION")));
    let out = Command::new(venv().join("bin/python"))
        .args([
            "-c",
            "import nestor, nestor._binary as b, nestor.tune, nestor.train, nestor.train.torch; print(nestor.__version__, b.find())",
        ])
        .env_remove("NESTOR_BIN")
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    let printed = passed(out);
    let (py_version, found) = printed.trim().split_once(' ').unwrap();
    assert_eq!(format!("nestor {py_version}"), version);
    assert_eq!(Path::new(found), bin, "the package finds the binary pip installed");
}

#[test]
fn a_function_trainable_runs_with_asha_and_its_best_checkpoint_is_one_call_away() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let out = passed(python(dir.path(), "examples/python/tune_function.py", &[], &[("EXAMPLE_STORAGE", storage.display().to_string())]));
    assert!(out.contains("best loss:") && out.contains("iterations (main)"), "{out}");
    let exp = storage.join("tune-function");
    let trials = trials(dir.path(), &exp);
    assert_eq!(trials.len(), 12);
    let iterations: Vec<usize> = trials.iter().map(|t| t["history"].as_array().unwrap().len()).collect();
    assert!(trials.iter().all(|t| t["status"] == "TERMINATED"), "{trials:?}");
    assert!(iterations.iter().any(|&n| n < 20), "ASHA stopped no trial early: {iterations:?}");
    assert!(iterations.contains(&20), "no trial reached max_t: {iterations:?}");
    let phases: Vec<&str> = trials[0]["history"].as_array().unwrap().iter().map(|r| r["phase"].as_str().unwrap()).collect();
    assert_eq!(&phases[..3], ["warmup", "warmup", "main"], "values that are not numbers are kept with each result");
    // The script's best is the store's best, and its checkpoint held that trial's last step.
    let best: serde_json::Value = serde_json::from_str(&ok(nestor(dir.path(), &["best", exp.to_str().unwrap(), "--json"]))).unwrap();
    let best_trial = trials.iter().find(|t| t["trial_id"] == best["trial_id"]).unwrap();
    let steps = best_trial["history"].as_array().unwrap().len();
    assert!(out.contains(&format!("holds step {steps}")), "{out}");
    assert!(out.contains(&format!("best config: {{'lr': {}", best["config"]["lr"])), "{out}\n{best}");
}

#[test]
fn warm_workers_import_once_and_keep_nothing_between_trials() {
    let dir = tempfile::tempdir().unwrap();
    let imports = dir.path().join("imports.txt");
    let storage = dir.path().join("runs");
    let out = passed(python(
        dir.path(),
        "tests/py/driver_warm.py",
        &[storage.to_str().unwrap()],
        &[("WARM_IMPORTS", imports.display().to_string())],
    ));
    assert_eq!(line(&out, "LEAKED"), "0", "a trial saw an earlier trial's state:\n{out}");
    assert_eq!(line(&out, "PIDS"), "8", "each trial is a process of its own");
    assert_eq!(line(&out, "PPIDS"), "1", "every trial was forked from the same warm process");
    let imported = std::fs::read_to_string(&imports).unwrap();
    // The driver imports the helper (it runs the script); the warm process is its fork and no trial imports it again.
    assert_eq!(imported.lines().count(), 1, "{imported}");
}

/// The driver, which imported what the function imports, is forked as the
/// sweep's warm process (its ranks are its grandchildren), yet each rank
/// starts as a fresh process's would; with a thread of its own it is not
/// forked and the binary starts the warm process. Either way the sweep's
/// callbacks see every result and nothing of the sweep outlives fit().
#[test]
fn the_driver_is_forked_as_the_warm_process_only_where_that_is_safe() {
    for (mode, forked) in [("fork", "4"), ("thread", "0")] {
        let dir = tempfile::tempdir().unwrap();
        let imports = dir.path().join("imports.txt");
        let out = passed(python(
            dir.path(),
            "tests/py/driver_warm_fork.py",
            &[dir.path().to_str().unwrap(), mode],
            &[("WARM_IMPORTS", imports.display().to_string())],
        ));
        assert_eq!(line(&out, "RESULTS"), "4", "{mode}:\n{out}");
        assert_eq!(line(&out, "LATE"), "4", "{mode}: a module on the PYTHONPATH the driver set did not import:\n{out}");
        assert_eq!(line(&out, "FORKED"), forked, "{mode}: ranks forked from the driver's fork:\n{out}");
        assert_eq!(line(&out, "CALLBACK"), "4", "{mode}: the callbacks saw every result:\n{out}");
        assert_eq!(line(&out, "CHILDREN"), "0", "{mode}: a process of the sweep outlived fit():\n{out}");
        // Only the driver ran its atexit handler (a rank or the warm process running it would leave its own file).
        let ran: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("atexit-").map(str::to_string))
            .collect();
        assert_eq!(ran, vec![line(&out, "DRIVER").to_string()], "{mode}:\n{out}");
        let imported = std::fs::read_to_string(&imports).unwrap();
        assert_eq!(imported.lines().count(), if mode == "fork" { 1 } else { 2 }, "{mode}: {imported}");
    }
}

#[test]
fn a_function_that_raises_names_the_rank_its_node_and_its_traceback() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let host = String::from_utf8(Command::new("hostname").output().unwrap().stdout).unwrap().trim().to_string();
    let out = passed(python(dir.path(), "tests/py/driver_fail.py", &[storage.to_str().unwrap(), "fit"], &[]));
    assert!(out.contains("RAISED TrainingFailedError"), "{out}");
    for needle in ["rank 1", &format!("on node {host}"), "Traceback (most recent call last)", "ValueError: boom at step 2 with lr=0.5"] {
        assert!(out.contains(needle), "the error lacks {needle:?}:\n{out}");
    }
    let out = passed(python(dir.path(), "tests/py/driver_fail.py", &[storage.to_str().unwrap(), "tuner"], &[]));
    assert_eq!(line(&out, "ERRORS"), "2 TERMINATED 0", "{out}");
    assert!(out.contains("ValueError: boom at step 2 with lr=0."), "{out}");
}

#[test]
fn bad_input_is_refused_naming_the_key_and_leaves_no_store() {
    for (case, needles) in [
        ("space", &["model.lr", "loguniform"][..]),
        ("scheduler", &["scheduler", "grace_period"][..]),
        ("learning_curve", &["scheduler", "threshold", "1.5"][..]),
        ("value", &["param_space: opt", "with_parameters"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let storage = dir.path().join("runs");
        let out = passed(python(dir.path(), "tests/py/driver_bad.py", &[storage.to_str().unwrap(), case], &[]));
        let refused = line(&out, "REFUSED");
        for n in needles {
            assert!(refused.contains(n), "{case}: {refused:?} does not name {n:?}");
        }
        assert!(!storage.join(case).join("store").exists(), "{case}: a store was made for a refused sweep");
    }
}

#[test]
fn tuner_restore_after_the_driver_and_the_binary_are_killed_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let acks = dir.path().join("acks.txt");
    let path = format!("{}:{}", venv().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new(venv().join("bin/python"));
    cmd.arg(repo().join("tests/py/driver_crash.py"))
        .args([storage.to_str().unwrap(), "run"])
        .current_dir(dir.path())
        .env("PATH", &path)
        .env_remove("NESTOR_BIN")
        .env("ACKS", &acks);
    let acked = trial_iterations(&kill_driver_midway(cmd, &acks, 10, dir.path()));
    assert!(!acked.is_empty());
    let out = passed(python(
        dir.path(),
        "tests/py/driver_crash.py",
        &[storage.to_str().unwrap(), "restore"],
        &[("ACKS", acks.display().to_string())],
    ));
    restored_whole(&out, &acked);
}

/// driver_crash.py's restore printed 4 TERMINATED trials, each with every
/// iteration once, in order, and every report acknowledged before the kill.
fn restored_whole(out: &str, acked: &std::collections::BTreeSet<(String, u64)>) {
    let status: BTreeMap<String, String> = serde_json::from_str(line(out, "STATUS")).unwrap();
    assert_eq!(status.len(), 4, "{out}");
    assert!(status.values().all(|s| s == "TERMINATED"), "{status:?}");
    let results: BTreeMap<String, Vec<u64>> = serde_json::from_str(line(out, "RESULT")).unwrap();
    for (trial, iters) in &results {
        assert_eq!(iters, &(1..=25).collect::<Vec<u64>>(), "{trial}: every iteration once, in order");
    }
    // Every report a rank saw acknowledged before the kill is in the store (the histories above are whole).
    for (trial, iter) in acked {
        assert!(results[trial].contains(iter), "acknowledged {trial} {iter} is missing");
    }
}

/// The same with `storage_path` in a bucket: the driver and the binary
/// are killed, the directory they ran in is deleted, and
/// `Tuner.restore("s3://bucket/runs/crash", trainable)` in another
/// directory brings the experiment back from the bucket alone (its store
/// and its driver's files) and finishes it, every acknowledged step kept.
#[test]
fn tuner_restore_from_the_bucket_alone_on_another_machine_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&dir.path().join("s3"));
    let acks = dir.path().join("acks.txt");
    let ran = dir.path().join("ran");
    std::fs::create_dir_all(&ran).unwrap();
    let path = format!("{}:{}", venv().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new(venv().join("bin/python"));
    cmd.arg(repo().join("tests/py/driver_crash.py"))
        .args(["s3://bucket/runs", "run"])
        .current_dir(&ran)
        .env("PATH", &path)
        .env_remove("NESTOR_BIN")
        .envs(s3.env())
        .env("ACKS", &acks);
    let acked = trial_iterations(&kill_driver_midway(cmd, &acks, 10, dir.path()));
    assert!(!acked.is_empty());
    std::fs::remove_dir_all(&ran).unwrap();
    let mut env: Vec<(&str, String)> = vec![("ACKS", acks.display().to_string())];
    let creds = s3.env();
    env.extend(creds.iter().map(|(k, v)| (k.as_str(), v.clone())));
    let out = passed(python(elsewhere.path(), "tests/py/driver_crash.py", &["s3://bucket/runs", "restore"], &env));
    restored_whole(&out, &acked);
    assert!(elsewhere.path().join("nestor-runs/crash/store").exists());
    // The files for people went up at the end too.
    assert!(s3.objects("runs/crash/trials/trial_00000").iter().any(|o| o.ends_with("result.jsonl")), "{:?}", s3.objects("runs/crash"));
}

#[test]
fn the_ray_train_and_tune_pattern_runs_with_its_imports_changed() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let out = passed(torch_python(dir.path(), "examples/python/tune_torch.py", &[], &[("EXAMPLE_STORAGE", storage.display().to_string())]));
    let exp = storage.join("tune-torch");
    let trials = trials(dir.path(), &exp);
    assert_eq!(trials.len(), 4);
    for t in &trials {
        assert_eq!(t["status"], "TERMINATED", "{t}");
        let history = t["history"].as_array().unwrap();
        // Both ranks were in one DDP process group at every step.
        assert!(history.iter().all(|r| r["workers"] == 2.0), "{t}");
        // Each checkpoint saved to a temporary directory by rank 0 was copied into the trial's storage.
        let last = t["checkpoints"].as_array().unwrap().last().unwrap();
        let model = Path::new(last["uri"].as_str().unwrap()).join("rank-0/model.pt");
        assert!(model.is_file(), "{} missing", model.display());
        assert_eq!(last["training_iteration"], history.last().unwrap()["training_iteration"]);
    }
    // The best result's checkpoint loaded through as_directory() holds its last epoch.
    let best: serde_json::Value = serde_json::from_str(&ok(nestor(dir.path(), &["best", exp.to_str().unwrap(), "--json"]))).unwrap();
    let best_trial = trials.iter().find(|t| t["trial_id"] == best["trial_id"]).unwrap();
    let epochs = best_trial["history"].as_array().unwrap().len();
    assert!(out.contains(&format!("(epoch {epochs})")), "{out}");
}

#[test]
fn a_function_the_workers_cannot_import_fails_its_trials_naming_the_import_unless_the_driver_is_forked() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let out =
        passed(python(dir.path(), "tests/py/driver_unimportable.py", &[storage.to_str().unwrap()], &[("NESTOR_WARM_FORK", "0".into())]));
    assert_eq!(line(&out, "ERRORS"), "2", "{out}");
    assert!(out.contains("ModuleNotFoundError: No module named 'only_here'"), "{out}");
    assert!(out.contains("warm worker process"), "{out}");
    assert!(processes_mentioning(dir.path().to_str().unwrap()).is_empty(), "a process of the sweep outlived it");
    // Forked from the driver, the warm process has the module already.
    let storage = dir.path().join("forked");
    let out = passed(python(dir.path(), "tests/py/driver_unimportable.py", &[storage.to_str().unwrap()], &[]));
    assert_eq!(line(&out, "ERRORS"), "0", "{out}");
    assert!(processes_mentioning(dir.path().to_str().unwrap()).is_empty(), "a process of the sweep outlived it");
}

/// `salloc -N2 ... python examples/python/tune_torch.py` from `cwd`, with
/// the cargo-built binary, 2 samples with their ranks on both nodes.
fn salloc_seed_script(cluster: &common::slurm::SlurmCluster, cwd: &Path) -> Command {
    let mut c = cluster.cmd("salloc");
    c.args(["-N2", "--ntasks-per-node=2", "--mem=3000"])
        .arg(torch_venv().join("bin/python"))
        .arg(repo().join("examples/python/tune_torch.py"))
        .current_dir(cwd)
        .env("NESTOR_BIN", nestor_bin())
        .env("EXAMPLE_SAMPLES", "2")
        .env("EXAMPLE_PLACEMENT", "STRICT_SPREAD");
    c
}

/// The same script inside a 2-node Slurm allocation whose nodes share the
/// experiment's directory but each have a temporary directory of their own
/// (TMPDIR: an empty tmpfs on each node): rank 0 saves each checkpoint to a
/// `tempfile` directory only its node sees, copies it into the trial's
/// staging directory itself, and the driver moves it into place.
#[test]
fn the_ray_pattern_in_a_two_node_allocation_checkpoints_from_each_nodes_own_tmp() {
    let scratch = tempfile::tempdir().unwrap();
    let on_both = vec![(0, scratch.path().to_path_buf()), (1, scratch.path().to_path_buf())];
    let options = common::slurm::Options { networks: true, hidden: on_both, ..Default::default() };
    let cluster = common::slurm::SlurmCluster::start_with(2, 2, 4000, options);
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let out = salloc_seed_script(&cluster, dir.path()).env("TMPDIR", scratch.path()).env("EXAMPLE_STORAGE", &storage).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = passed(out);
    assert!(stderr.contains("nestor: Slurm job "), "{stderr}");
    let trials = trials(dir.path(), &storage.join("tune-torch"));
    assert_eq!(trials.len(), 2);
    for t in &trials {
        assert_eq!(t["status"], "TERMINATED", "{t}\n{stdout}\n{stderr}");
        assert_eq!(t["nodes"], serde_json::json!(["node1", "node2"]), "{t}");
        let history = t["history"].as_array().unwrap();
        assert!(history.iter().all(|r| r["workers"] == 2.0), "{t}");
        for c in t["checkpoints"].as_array().unwrap() {
            let model = Path::new(c["uri"].as_str().unwrap()).join("rank-0/model.pt");
            assert!(model.is_file(), "{} missing", model.display());
        }
        assert!(!Path::new(t["path"].as_str().unwrap()).join(".incoming").exists(), "staged copies left behind");
    }
    assert!(stdout.contains("best checkpoint:"), "{stdout}");
}

#[test]
fn with_checkpoints_in_a_bucket_each_rank_uploads_its_own_and_the_best_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&dir.path().join("s3"));
    let creds = s3.env();
    let mut env: Vec<(&str, String)> = creds.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    env.push(("NESTOR_LOG", "warn,trainer::intake=debug".into()));
    let out = python(dir.path(), "tests/py/driver_s3.py", &[], &env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = passed(out);
    let shards: Vec<&str> = stderr.lines().filter(|l| l.contains("checkpoint shard")).collect();
    assert_eq!(shards.len(), 6, "{stderr}");
    assert!(shards.iter().all(|l| l.contains("uploaded by the rank")), "a shard went through the driver:\n{stderr}");
    assert_eq!(line(&stdout, "CHECKPOINT"), "s3://bucket/runs/s3/trials/trial_00001/checkpoint_000003");
    assert_eq!(line(&stdout, "STATE"), r#"{"step": 3, "a": 2.0, "rank": 0}"#);
    assert_eq!(s3.objects("runs/s3/trials/trial_00001/checkpoint_000003").len(), 2, "the shard and the commit marker");
}

/// The same script inside a 2-node allocation whose nodes share no
/// directory with the driver, checkpoints in a bucket: the ranks load the
/// pickled function from the driver (`GetFile`), upload their shards to the
/// bucket themselves, meet through the driver, and the best checkpoint
/// comes back from the bucket.
#[test]
fn the_ray_pattern_on_nodes_sharing_no_directory_checkpoints_to_the_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("nestor-runs");
    std::fs::create_dir_all(&local).unwrap();
    let s3 = S3Server::start(&dir.path().join("s3"));
    // Nodes on this machine's loopback (where the S3 server listens), each seeing an empty directory where the experiment is.
    let options = common::slurm::Options { hidden: vec![(0, local.clone()), (1, local.clone())], ..Default::default() };
    let cluster = common::slurm::SlurmCluster::start_with(2, 2, 4000, options);
    let out = salloc_seed_script(&cluster, dir.path())
        .env("EXAMPLE_STORAGE", "s3://bucket/runs")
        .env("NESTOR_LOG", "warn,trainer::intake=debug")
        .envs(s3.env())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = passed(out);
    assert!(stderr.contains("is not shared with node1, node2"), "{stderr}");
    let shards: Vec<&str> = stderr.lines().filter(|l| l.contains("checkpoint shard")).collect();
    assert!(!shards.is_empty() && shards.iter().all(|l| l.contains("uploaded by the rank")), "{stderr}");
    let trials = trials(dir.path(), &local.join("tune-torch"));
    assert_eq!(trials.len(), 2);
    for t in &trials {
        assert_eq!(t["status"], "TERMINATED", "{t}\n{stderr}");
        assert_eq!(t["nodes"], serde_json::json!(["node1", "node2"]), "{t}");
        assert!(t["history"].as_array().unwrap().iter().all(|r| r["workers"] == 2.0), "{t}");
        let last = t["checkpoints"].as_array().unwrap().last().unwrap()["uri"].as_str().unwrap().to_string();
        let key = last.strip_prefix("s3://bucket/").unwrap();
        assert!(s3.objects(key).iter().any(|o| o.ends_with("rank-0/model.pt")), "{last}: {:?}", s3.objects(key));
    }
    let best = line(&stdout, "best checkpoint:");
    assert!(best.starts_with("s3://bucket/runs/tune-torch/trials/") && best.contains("(epoch "), "{stdout}");
}

#[test]
fn rays_logger_callbacks_become_nestors_loggers() {
    let dir = tempfile::tempdir().unwrap();
    let out = python(dir.path(), "tests/py/loggers_sweep.py", &["runs"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = passed(out);
    assert_eq!(line(&stdout, "terminated:"), "3", "{stderr}");
    let exp = dir.path().join("runs/loggers");
    let toml = std::fs::read_to_string(exp.join("experiment.toml")).unwrap();
    for t in ["tensorboard", "mlflow", "wandb"] {
        assert!(toml.contains(&format!("type = \"{t}\"")), "{toml}");
    }
    // The loggers that cannot work say so, once each, and the sweep went on.
    assert!(stderr.contains("callback mlflow failed"), "{stderr}");
    assert!(stderr.contains("callback wandb failed") && stderr.contains("wandb"), "{stderr}");
    // TensorBoard's files hold every result.
    for t in trials(dir.path(), &exp) {
        let id = t["trial_id"].as_str().unwrap();
        let files: Vec<_> = std::fs::read_dir(exp.join("trials").join(id))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("events.out.tfevents."))
            .collect();
        assert_eq!(files.len(), 1, "{id}");
        let events = tuner::callback::tensorboard::read_events(&files[0].path()).unwrap();
        let steps: Vec<i64> = events.iter().filter(|(_, v)| v.iter().any(|(k, _)| k == "loss")).map(|(s, _)| *s).collect();
        assert_eq!(steps, [1, 2, 3, 4, 5], "{id}");
    }
}
