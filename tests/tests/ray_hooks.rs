//! Python code a sweep calls, served by the driver's own process while the
//! binary runs the loop (tests/py/ray_hooks.py): `tune.Callback` and
//! `LoggerCallback` subclasses fed every durable event in order, callbacks
//! that raise or hang, a stop function and a `Stopper` whose `stop_all`
//! ends the sweep, PBT's lambda mutations and `custom_explore_fn`, and a
//! sweep with callbacks killed with its driver and restored.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Output;

use common::python::{kill_driver_midway, line, passed, torch_python, torch_python_cmd, trial_iterations};
use common::*;
use serde_json::Value;

fn hooks(dir: &Path, scenario: &str, env: &[(&str, String)]) -> (Value, String) {
    let storage = dir.join("runs");
    let out: Output = torch_python(dir, "tests/py/ray_hooks.py", &[storage.to_str().unwrap(), scenario], env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = passed(out);
    (serde_json::from_str(line(&stdout, "OUT")).unwrap(), stderr)
}

/// Each trial's stored iterations.
fn iterations(out: &Value) -> BTreeMap<String, Vec<u64>> {
    out["trials"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(id, t)| (id.clone(), t["history"].as_array().unwrap().iter().map(|h| h[0].as_u64().unwrap()).collect()))
        .collect()
}

#[test]
fn callbacks_get_every_hook_in_order_and_one_that_raises_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (out, stderr) = hooks(dir.path(), "callbacks", &[]);
    let stored = iterations(&out);
    assert_eq!(stored.len(), 3);
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(calls[0], serde_json::json!(["setup", 3]));
    let last = calls.last().unwrap();
    assert_eq!(last[0], "on_experiment_end");
    assert_eq!(last[1].as_array().unwrap().len(), 3, "{last}");
    for (trial, iters) in &stored {
        let mine: Vec<&Value> = calls.iter().filter(|c| c.get(1).and_then(Value::as_str) == Some(trial)).collect();
        let names: Vec<&str> = mine.iter().map(|c| c[0].as_str().unwrap()).collect();
        assert_eq!(names.first(), Some(&"on_trial_start"), "{trial}: {names:?}");
        assert_eq!(names.last(), Some(&"on_trial_complete"), "{trial}: {names:?}");
        assert_eq!(mine.last().unwrap()[2], "TERMINATED");
        // Every stored result once, in order, each followed by its checkpoint's hooks.
        let results: Vec<u64> = mine.iter().filter(|c| c[0] == "on_trial_result").map(|c| c[2].as_u64().unwrap()).collect();
        assert_eq!(&results, iters, "{trial}");
        let saved: Vec<String> = mine.iter().filter(|c| c[0] == "on_checkpoint").map(|c| c[2].as_str().unwrap().to_string()).collect();
        assert_eq!(saved, iters.iter().map(|i| format!("checkpoint_{i:06}")).collect::<Vec<_>>(), "{trial}");
        assert_eq!(names.iter().filter(|n| **n == "on_trial_save").count(), iters.len());
        // The LoggerCallback's view of the same trial.
        let logged: Vec<&Value> = out["logger"].as_array().unwrap().iter().filter(|l| l[1].as_str() == Some(trial.as_str())).collect();
        assert_eq!(logged.first().unwrap()[0], "start");
        assert_eq!(logged.last().unwrap().as_array().unwrap()[..], [Value::from("end"), Value::from(trial.as_str()), Value::from(false)]);
        assert_eq!(logged.iter().filter(|l| l[0] == "result").count(), iters.len());
    }
    // The callback that raised in every hook was logged, and changed nothing.
    assert!(stderr.contains("callback Raises.on_trial_result raised (the sweep goes on)"), "{stderr}");
    assert!(stderr.contains("RuntimeError: a callback that fails"), "{stderr}");
    assert!(stored.values().all(|i| i.len() == 6));
}

#[test]
fn a_callback_that_hangs_holds_up_neither_the_sweep_nor_the_script() {
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = hooks(dir.path(), "hang", &[("NESTOR_CALLBACK_DEADLINE_S", "3".into())]);
    let stored = iterations(&out);
    assert_eq!(stored.len(), 3);
    assert!(stored.values().all(|i| i.len() == 6), "{stored:?}");
    let seconds = out["seconds"].as_f64().unwrap();
    assert!(seconds < 30.0, "fit() waited {seconds} s for a callback that never returns");
    assert!(processes_mentioning(dir.path().to_str().unwrap()).is_empty());
}

#[test]
fn a_stop_function_ends_each_trial_where_it_says() {
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = hooks(dir.path(), "stop_fn", &[]);
    let t = &out["trials"];
    let ends: BTreeMap<String, usize> =
        t.as_object().unwrap().values().map(|t| (t["config"]["lr"].to_string(), t["history"].as_array().unwrap().len())).collect();
    // score = lr * step >= 5: lr 1 at step 5, lr 2 at 3, lr 3 at 2.
    assert_eq!(ends, BTreeMap::from([("1.0".into(), 5), ("2.0".into(), 3), ("3.0".into(), 2)]), "{t}");
}

#[test]
fn a_stoppers_stop_all_ends_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let (out, stderr) = hooks(dir.path(), "stopper", &[]);
    let stored = iterations(&out);
    // One trial at a time: the first stops itself at score 4 (its 4th result); the
    // sweep ends at the 7th result in all, so the third trial never starts.
    assert_eq!(stored.get("trial_00000"), Some(&vec![1, 2, 3, 4]), "{stored:?}");
    assert_eq!(stored.values().map(Vec::len).sum::<usize>(), 7, "{stored:?}");
    assert!(!stored.contains_key("trial_00002"), "{stored:?}");
    assert!(stderr.contains("A stopper ended the sweep"), "{stderr}");
}

#[test]
fn pbts_lambda_mutations_and_custom_explore_run_in_the_script() {
    let dir = tempfile::tempdir().unwrap();
    let _ = hooks(dir.path(), "pbt", &[]);
    let exp = dir.path().join("runs/pbt");
    let exploits: Vec<Value> =
        ok(nestor(dir.path(), &["exploits", exp.to_str().unwrap(), "--json"])).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!exploits.is_empty(), "no exploit in 4 trials of 8 steps with perturbations every 2");
    for e in &exploits {
        let lr = e["new_config"]["lr"].as_f64().unwrap();
        // The lambda draws in [0.001, 0.1), a factor moves the donor's, the custom step caps at 0.05.
        assert!(lr > 0.0 && lr <= 0.05, "{e}");
        assert_eq!(e["new_config"]["steps"], 8, "{e}");
    }
}

#[test]
fn sample_from_functions_run_per_trial_reading_the_rest_of_the_config_and_repeat_with_the_seed() {
    let dir = tempfile::tempdir().unwrap();
    let configs = |run: &str| -> Vec<Value> {
        let (out, _) = hooks(dir.path(), "sample", &[("RUN", run.into())]);
        out["trials"].as_object().unwrap().values().map(|t| t["config"].clone()).collect()
    };
    let first = configs("a");
    assert_eq!(first.len(), 6);
    for c in &first {
        let width = c["width"].as_u64().unwrap();
        assert_eq!(c["depth"].as_u64(), Some(width / 16), "{c}");
        assert_eq!(c["last"].as_u64(), Some(width / 16 + 100), "a value read from another sample_from: {c}");
        let (lr, decay) = (c["opt"]["lr"].as_f64().unwrap(), c["opt"]["decay"].as_f64().unwrap());
        assert!((decay - lr / 10.0).abs() < 1e-15, "{c}");
        let noise = c["noise"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&noise), "{c}");
    }
    let noises: BTreeSet<String> = first.iter().map(|c| c["noise"].to_string()).collect();
    assert_eq!(noises.len(), 6, "a function of nothing is drawn again for each trial: {first:?}");
    // The same seed, the same configs, sample_from's draws included.
    assert_eq!(configs("b"), first);
}

#[test]
fn a_define_by_run_optuna_space_runs_in_the_script_and_learns_every_trial() {
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = hooks(dir.path(), "optuna", &[]);
    let trials = out["trials"].as_object().unwrap();
    assert_eq!(trials.len(), 10);
    for (id, t) in trials {
        let c = &t["config"];
        assert_eq!(c["steps"], 3, "the function's constants: {id} {c}");
        match c["activation"].as_str().unwrap() {
            // The space is conditional: each branch has its own parameter, nested by Optuna's `a/b` name.
            "relu" => {
                let mult = c["nested"]["mult"].as_f64().unwrap();
                assert!((0.01..=0.05).contains(&mult) && c.get("height").is_none(), "{id} {c}");
            }
            "tanh" => {
                let height = c["height"].as_i64().unwrap();
                assert!((-10..=10).contains(&height) && c.get("nested").is_none(), "{id} {c}");
            }
            other => panic!("{id}: activation {other}"),
        }
    }
    // Optuna's study was told every trial's end with its metric, and saved beside the experiment.
    assert_eq!(out["told"], 10);
}

#[test]
fn a_sweep_with_callbacks_killed_with_its_driver_is_restored_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let acks = dir.path().join("acks.txt");
    let log = dir.path().join("hooks.jsonl");
    let env = [("ACKS", acks.display().to_string()), ("HOOKS_LOG", log.display().to_string())];
    let cmd = torch_python_cmd(dir.path(), "tests/py/ray_hooks.py", &[storage.to_str().unwrap(), "crash", "run"], &env);
    let acked = trial_iterations(&kill_driver_midway(cmd, &acks, 12, &storage));
    let before = read(&log).lines().count();
    let out = passed(torch_python(dir.path(), "tests/py/ray_hooks.py", &[storage.to_str().unwrap(), "crash", "restore"], &env));
    let got: Value = serde_json::from_str(line(&out, "OUT")).unwrap();
    let stored = iterations(&got);
    assert_eq!(stored.len(), 4);
    for (trial, iters) in &stored {
        assert_eq!(iters, &(1..=30).collect::<Vec<u64>>(), "{trial}: every iteration once, in order");
    }
    for (trial, iteration) in &acked {
        assert!(stored[trial].contains(iteration), "acknowledged {trial} {iteration} is missing");
    }
    // The restored sweep fed the callbacks the script had given (unpickled from the experiment):
    // a second setup, then every trial's last result and end.
    let calls: Vec<Value> = read(&log).lines().skip(before).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(calls.first().map(|c| c[0].clone()), Some(Value::from("setup")), "{calls:?}");
    for trial in stored.keys() {
        let t = Value::from(trial.as_str());
        assert!(calls.iter().any(|c| c[0] == "on_trial_result" && c[1] == t && c[2] == 30), "{trial}: {calls:?}");
        assert!(calls.iter().any(|c| c[0] == "on_trial_complete" && c[1] == t), "{trial}: {calls:?}");
    }
    assert_eq!(calls.last().unwrap()[0], "on_experiment_end");
}
