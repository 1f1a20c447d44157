//! A TOML sweep whose `command` runs a Python script gets warm workers:
//! the script's imports load once, in a warm process, and every trial is a
//! fresh fork of it that runs the script as `python script.py` would (its
//! arguments, `__main__`, its exit code, its traceback), keeping nothing of
//! an earlier trial. `warm = false` starts every trial cold, with the same
//! results.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::python::{line, passed, repo, torch_python_cmd, torch_venv, trials};
use common::*;

const SWEEP: &str = r#"
[experiment]
name = "warm"
num_samples = 1
max_concurrent_trials = 3

[space]
x = { grid = ["a", "b", "c", "d", "raise", "exit"] }

[trainer]
command = ["python", "warm_script.py", "--flag", "v"]
"#;

/// Runs the sweep in `dir` (the scripts copied there) with the cached
/// environment's python first on PATH, `extra` appended to the file; the
/// trials as exported, and the lines the helper wrote at each import.
fn sweep(dir: &Path, extra: &str) -> (Vec<serde_json::Value>, Vec<String>) {
    for f in ["warm_script.py", "warm_helper.py"] {
        std::fs::copy(repo().join("tests/py").join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("sweep.toml"), format!("{SWEEP}{extra}")).unwrap();
    let imports = dir.join("imports.txt");
    let path = format!("{}:{}", torch_venv().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(nestor_bin())
        .args(["run", "sweep.toml", "--storage", "runs", "--plain"])
        .current_dir(dir)
        .env("PATH", path)
        .env("WARM_IMPORTS", &imports)
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("6 trials (4 TERMINATED, 2 ERROR)"), "{said}");
    let imported = std::fs::read_to_string(&imports).unwrap_or_default().lines().map(String::from).collect();
    (trials(dir, &dir.join("runs/warm")), imported)
}

fn by_x<'a>(trials: &'a [serde_json::Value], x: &str) -> &'a serde_json::Value {
    trials.iter().find(|t| t["config"]["x"] == x).unwrap_or_else(|| panic!("no trial with x = {x}: {trials:?}"))
}

/// The four trials that report: each its own process, run as `python
/// warm_script.py --flag v` would, seeing nothing of another; their parents.
fn check_reports(trials: &[serde_json::Value]) -> BTreeSet<u64> {
    let mut pids = BTreeSet::new();
    let mut parents = BTreeSet::new();
    for x in ["a", "b", "c", "d"] {
        let t = by_x(trials, x);
        let last = t["metrics"].clone();
        assert_eq!(t["status"], "TERMINATED", "{t}");
        assert_eq!(last["argv"], "warm_script.py --flag v", "{t}");
        assert_eq!((&last["file_abs"], &last["path0"], last["leaked"].as_f64()), (&true.into(), &true.into(), Some(0.0)), "{t}");
        assert_eq!(last["threads_env"], "1", "each rank's own variables: {t}");
        pids.insert(last["pid"].as_f64().unwrap() as u64);
        parents.insert(last["ppid"].as_f64().unwrap() as u64);
    }
    assert_eq!(pids.len(), 4, "each trial is a process of its own: {pids:?}");
    parents
}

/// The two that fail: a raise is a traceback from the script (none of
/// nestor's frames) and code 1; `sys.exit(3)` is code 3.
fn check_failures(dir: &Path, trials: &[serde_json::Value]) {
    let raised = by_x(trials, "raise");
    assert_eq!(raised["status"], "ERROR", "{raised}");
    let error = raised["error"].as_str().unwrap_or_default();
    assert!(error.contains("exited with code 1"), "{error}");
    let id = raised["trial_id"].as_str().unwrap();
    let log = read(&dir.join(format!("runs/warm/trials/{id}/logs/rank-0.log")));
    let script = dir.join("warm_script.py").canonicalize().unwrap();
    assert!(log.contains("Traceback (most recent call last):"), "{log}");
    assert!(log.contains(&format!("File \"{}\", line", script.display())), "the script's frames, by its absolute path:\n{log}");
    assert!(log.contains("ValueError: this trial fails on purpose"), "{log}");
    assert!(!log.contains("<string>") && !log.contains("runpy") && !log.contains("zygote"), "nestor's frames left out:\n{log}");
    let exited = by_x(trials, "exit");
    assert_eq!(exited["status"], "ERROR", "{exited}");
    assert!(exited["error"].as_str().unwrap_or_default().contains("exited with code 3"), "{exited}");
}

#[test]
fn a_python_script_sweep_forks_every_trial_from_one_warm_process_that_imported_once() {
    let dir = tempfile::tempdir().unwrap();
    let (trials, imported) = sweep(dir.path(), "");
    let parents = check_reports(&trials);
    assert_eq!(parents.len(), 1, "every trial forked from the same warm process: {parents:?}");
    assert_eq!(imported.len(), 1, "the helper imported once, by the warm process: {imported:?}");
    assert_eq!(parents.iter().next().map(u64::to_string), imported.first().cloned(), "the trials' parent is the process that imported it");
    check_failures(dir.path(), &trials);
}

#[test]
fn warm_false_starts_every_trial_cold_with_the_same_results() {
    let dir = tempfile::tempdir().unwrap();
    let (trials, imported) = sweep(dir.path(), "warm = false\n");
    let parents = check_reports(&trials);
    assert_eq!(imported.len(), 6, "every trial imports the helper itself: {imported:?}");
    assert!(parents.iter().all(|p| !imported.contains(&p.to_string())), "no trial's parent imported it: {parents:?} {imported:?}");
    check_failures(dir.path(), &trials);
}

#[test]
fn a_script_that_is_not_there_fails_its_trial_as_python_would() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = "[experiment]\nname = \"missing\"\n\n[space]\nx = 1\n\n[trainer]\ncommand = [\"python\", \"missing.py\"]\n";
    std::fs::write(dir.path().join("sweep.toml"), sweep).unwrap();
    let path = format!("{}:{}", torch_venv().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(nestor_bin())
        .args(["run", "sweep.toml", "--storage", "runs", "--plain"])
        .current_dir(dir.path())
        .env("PATH", path)
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("exited with code 2"), "Python's code for a script it cannot open:\n{said}");
    let log = read(&dir.path().join("runs/missing/trials/trial_00000/logs/rank-0.log"));
    assert!(log.contains("can't open file") && log.contains("missing.py"), "{log}");
}

/// The Python driver is forked as the warm process only while that is
/// safe: after a torch operation of its own (OpenMP's threads up, which a
/// fork would wait for in its first parallel region) the binary starts the
/// warm process, and the ranks' parallel operations finish either way.
#[test]
fn a_driver_whose_openmp_threads_are_up_is_not_forked_and_its_ranks_finish() {
    for (mode, forked) in [("clean", "1"), ("omp", "0")] {
        let dir = tempfile::tempdir().unwrap();
        let cmd = torch_python_cmd(dir.path(), "tests/py/driver_warm_omp.py", &[dir.path().to_str().unwrap(), mode], &[]);
        // A rank that waited for ever would hold the test: the sweep is short, so it gets a bound.
        let out = Command::new("timeout")
            .arg("240")
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .current_dir(dir.path())
            .output()
            .unwrap();
        let out = passed(out);
        assert_eq!(line(&out, "FORKED"), forked, "{mode}:\n{out}");
        assert_eq!(line(&out, "THREADS"), "2", "{mode}:\n{out}");
    }
}
