//! Ray Tune + Ray Train scripts in the shapes Ray's own examples and user
//! guides take, run for real with their imports changed (the scripts are
//! tests/py/ray_class.py and tests/py/ray_behaviours.py): class trainables
//! under HyperBand, BOHB and PBT (paused, resumed, exploited through their
//! checkpoints), `done=True`, `~` in storage paths, `init(num_cpus=)`,
//! `num_to_keep` with a score, the torch process group before the training
//! function, and a class-trainable sweep whose driver is SIGKILLed and
//! restored.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::python::{kill_driver_midway, line, passed, torch_python, torch_python_cmd, trial_iterations, trials};
use common::*;
use serde_json::Value;

fn class_script(dir: &Path, scenario: &str) -> BTreeMap<String, Value> {
    let storage = dir.join("runs");
    let out = passed(torch_python(dir, "tests/py/ray_class.py", &[storage.to_str().unwrap(), scenario], &[]));
    serde_json::from_str(line(&out, "TRIALS")).unwrap()
}

/// (iteration, seen, score) of each result.
fn history(t: &Value) -> Vec<(u64, u64, f64)> {
    t["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h[0].as_f64().unwrap() as u64, h[1].as_f64().unwrap() as u64, h[2].as_f64().unwrap()))
        .collect()
}

/// Every result's state went through exactly as many steps as the trial
/// has trained: nothing lost or repeated across pauses and restarts.
fn assert_state_carried(id: &str, t: &Value) {
    for (iteration, seen, _) in history(t) {
        assert_eq!(iteration, seen, "{id}: the state of iteration {iteration} had seen {seen} steps: {t}");
    }
}

/// How many runs of `trial` ended with `cleanup()` (one file per run).
fn cleanups(exp: &Path, trial: &str) -> usize {
    std::fs::read_dir(exp.join("trials").join(trial).join("cleanups")).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn a_class_trainable_under_hyperband_is_paused_and_resumed_with_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let got = class_script(dir.path(), "hyperband");
    let exp = dir.path().join("runs/hyperband");
    let stored = trials(dir.path(), &exp);
    assert_eq!(got.len(), 9);
    let resumed: Vec<&Value> = stored.iter().filter(|t| t["resumes"].as_u64().unwrap() > 0).collect();
    assert!(!resumed.is_empty(), "HyperBand resumed no trial: {stored:?}");
    for (id, t) in &got {
        assert_eq!(t["status"], "TERMINATED", "{id}: {t}");
        assert_state_carried(id, t);
        // The score is the rate times the steps: the state was this trial's own.
        let rate = t["config"]["rate"].as_f64().unwrap();
        for (iteration, _, score) in history(t) {
            assert!((score - rate * iteration as f64).abs() < 1e-9, "{id}: {t}");
        }
    }
    for t in &resumed {
        let id = t["trial_id"].as_str().unwrap();
        // A run per start: the first and each resume, every one cleaned up.
        assert_eq!(cleanups(&exp, id), 1 + t["resumes"].as_u64().unwrap() as usize, "{id}");
        assert!(got[id]["history"].as_array().unwrap().len() > 1);
    }
    assert!(got.values().any(|t| t["history"].as_array().unwrap().len() == 9), "no trial reached max_t");
}

#[test]
fn a_class_trainable_stopped_mid_step_still_runs_its_cleanup() {
    // The time budget ends the sweep while both trials are inside step():
    // nestor stops them with SIGTERM, and as in Ray their stop() and
    // cleanup() still run.
    let dir = tempfile::tempdir().unwrap();
    let got = class_script(dir.path(), "budget");
    let exp = dir.path().join("runs/budget");
    assert_eq!(got.len(), 2);
    for (id, t) in &got {
        assert!(!t["history"].as_array().unwrap().is_empty(), "{id}: {t}");
        assert_eq!(cleanups(&exp, id), 1, "{id}: cleanup() did not run when the run was stopped");
    }
}

#[test]
fn a_class_trainable_under_bohb_restores_from_files_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let got = class_script(dir.path(), "bohb");
    assert_eq!(got.len(), 8);
    for (id, t) in &got {
        assert_eq!(t["status"], "TERMINATED", "{id}: {t}");
        assert_state_carried(id, t);
    }
    let exp = dir.path().join("runs/bohb");
    assert!(trials(dir.path(), &exp).iter().any(|t| t["resumes"].as_u64().unwrap() > 0), "BOHB's HyperBand resumed no trial");
}

#[test]
fn pbt_with_more_samples_than_slots_runs_the_whole_population_and_exploits_through_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let got = class_script(dir.path(), "pbt");
    let exp = dir.path().join("runs/pbt");
    let stored = trials(dir.path(), &exp);
    assert_eq!(got.len(), 8);
    // init(num_cpus=2) is the pool the sweep scheduled on.
    assert!(read(&exp.join("experiment.toml")).contains("[resources]\nCPU = 2.0"));
    for (id, t) in &got {
        assert_eq!(t["status"], "TERMINATED", "{id}: {t}");
        // Every member trained to the end: none was left behind by the two that happened to run first.
        assert_eq!(history(t).last().unwrap().0, 24, "{id}: {t}");
    }
    // Every trial yielded its slot at some interval (8 trials, 2 slots).
    for t in &stored {
        assert!(t["resumes"].as_u64().unwrap() >= 1, "{} never paused: {t}", t["trial_id"]);
    }
    let exploits: Vec<Value> =
        ok(nestor(dir.path(), &["exploits", exp.to_str().unwrap(), "--json"])).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(exploits.len() >= 4, "{exploits:?}");
    let recipients: BTreeSet<&str> = exploits.iter().map(|e| e["trial_id"].as_str().unwrap()).collect();
    let donors: BTreeSet<&str> = exploits.iter().map(|e| e["donor"].as_str().unwrap()).collect();
    assert!(recipients.len() >= 3 && donors.len() >= 2, "a population of 8 took part in {exploits:?}");
    // A recipient's state after the exploit is the donor's at its checkpoint: the
    // steps seen still match the iteration, though the score came from another trial.
    for (id, t) in &got {
        assert_state_carried(id, t);
    }
}

#[test]
fn done_ends_a_class_trainables_trial_where_it_says() {
    let dir = tempfile::tempdir().unwrap();
    let got = class_script(dir.path(), "done");
    let ends: BTreeSet<u64> = got.values().map(|t| history(t).last().unwrap().0).collect();
    assert_eq!(ends, BTreeSet::from([2, 5]), "{got:?}");
    assert!(got.values().all(|t| t["status"] == "TERMINATED"));
}

#[test]
fn done_in_a_functions_report_ends_its_trial() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let out = passed(torch_python(dir.path(), "tests/py/ray_behaviours.py", &[storage.to_str().unwrap(), "done"], &[]));
    for key in ["DONE-PLAIN", "DONE-STOP"] {
        let got: BTreeMap<String, Value> = serde_json::from_str(line(&out, key)).unwrap();
        let mut ends: Vec<(u64, usize)> =
            got.values().map(|t| (t["config"]["done_at"].as_u64().unwrap(), t["history"].as_array().unwrap().len())).collect();
        ends.sort_unstable();
        // done_at 3 ends at its third result; done_at 20 runs its 10 steps out.
        assert_eq!(ends, vec![(3, 3), (20, 10)], "{key}: {got:?}");
        assert!(got.values().all(|t| t["status"] == "TERMINATED"), "{key}: {got:?}");
    }
}

#[test]
fn a_tilde_storage_path_is_the_home_directory_for_the_driver_and_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let cwd = dir.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let out = passed(torch_python(&cwd, "tests/py/ray_behaviours.py", &["unused", "home"], &[("HOME", home.display().to_string())]));
    let got: Value = serde_json::from_str(line(&out, "HOME")).unwrap();
    assert_eq!(got["path"], home.join("tilde-runs/tilde").display().to_string());
    assert_eq!(got["trials"].as_object().unwrap().len(), 1, "{got}");
    assert!(home.join("tilde-runs/tilde/store").is_dir());
    assert!(!cwd.join("~").exists(), "a literal ~ directory was made");
}

#[test]
fn init_num_cpus_is_the_pool_the_sweep_schedules_on() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let out = passed(torch_python(dir.path(), "tests/py/ray_behaviours.py", &[storage.to_str().unwrap(), "init"], &[]));
    let spans: Vec<(f64, f64)> = serde_json::from_str(line(&out, "INIT")).unwrap();
    assert_eq!(spans.len(), 3);
    // init(num_cpus=1) on a machine with more: one trial at a time.
    let mut sorted = spans.clone();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in sorted.windows(2) {
        assert!(w[1].0 >= w[0].1, "two trials ran at once on one CPU: {sorted:?}");
    }
}

#[test]
fn tuner_restore_resumes_or_restarts_the_trials_in_error() {
    for (scenario, starts) in [("errored-resume", [0.0, 0.0, 2.0, 2.0, 2.0]), ("errored-restart", [0.0; 5])] {
        let dir = tempfile::tempdir().unwrap();
        let storage = dir.path().join("runs");
        let out = passed(torch_python(dir.path(), "tests/py/ray_behaviours.py", &[storage.to_str().unwrap(), scenario], &[]));
        let got: Value = serde_json::from_str(line(&out, "ERRORED")).unwrap();
        let first = &got["first"]["trial_00000"];
        assert_eq!(first["status"], "ERROR", "{scenario}: {first}");
        assert_eq!(first["history"].as_array().unwrap().len(), 2, "{scenario}: {first}");
        let then = &got["then"]["trial_00000"];
        assert_eq!(then["status"], "TERMINATED", "{scenario}: {then}");
        let history = then["history"].as_array().unwrap();
        let iterations: Vec<u64> = history.iter().map(|h| h["training_iteration"].as_u64().unwrap()).collect();
        assert_eq!(iterations, vec![1, 2, 3, 4, 5], "{scenario}: each iteration once: {then}");
        // Where each result's run started: from checkpoint 2 (resume) or from nothing (restart).
        let from: Vec<f64> = history.iter().map(|h| h["start"].as_f64().unwrap()).collect();
        assert_eq!(from, starts, "{scenario}: {then}");
        // The trial's result.jsonl agrees: a restart starts it over.
        let lines = std::fs::read_to_string(storage.join(scenario).join("trials/trial_00000/result.jsonl")).unwrap();
        let in_file: Vec<u64> =
            lines.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["training_iteration"].as_u64().unwrap()).collect();
        assert_eq!(in_file, vec![1, 2, 3, 4, 5], "{scenario}: result.jsonl");
    }
}

#[test]
fn a_trainers_fit_run_again_after_a_kill_goes_on_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let acks = dir.path().join("acks.txt");
    let env = [("ACKS", acks.display().to_string())];
    let cmd = torch_python_cmd(dir.path(), "tests/py/ray_trainer.py", &[storage.to_str().unwrap(), "fit"], &env);
    let acked: BTreeSet<u64> = kill_driver_midway(cmd, &acks, 5, &storage).iter().map(|l| l.parse().unwrap()).collect();
    // The same script again: the run goes on, it does not start over.
    let out = passed(torch_python(dir.path(), "tests/py/ray_trainer.py", &[storage.to_str().unwrap(), "fit"], &env));
    let history: Vec<(u64, u64, u64)> = serde_json::from_str(line(&out, "HISTORY")).unwrap();
    assert_eq!(history.iter().map(|h| h.0).collect::<Vec<_>>(), (1..=30).collect::<Vec<u64>>(), "{history:?}");
    assert!(history.iter().all(|h| h.0 == h.1), "{history:?}");
    assert!(history.last().unwrap().2 > 0, "the second run started from nothing: {history:?}");
    assert!(acked.iter().all(|a| history.iter().any(|h| h.1 == *a)), "{acked:?} {history:?}");
    // resume_from_checkpoint=: a new run starts from the first one's latest checkpoint (step 30).
    let out = passed(torch_python(dir.path(), "tests/py/ray_trainer.py", &[storage.to_str().unwrap(), "from"], &[]));
    let history: Vec<(u64, u64, u64)> = serde_json::from_str(line(&out, "HISTORY")).unwrap();
    assert_eq!(history.iter().map(|h| h.1).collect::<Vec<_>>(), (31..=35).collect::<Vec<u64>>(), "{history:?}");
    assert!(history.iter().all(|h| h.2 == 30), "{history:?}");
}

/// The tables of an experiment's resolved file that say what the sweep does
/// (not how its trials are launched, nor where it is).
fn what_it_does(exp: &Path) -> String {
    let text = read(&exp.join("experiment.toml"));
    let mut doc: toml::Table = text.parse().unwrap();
    doc.remove("trainer");
    let e = doc.get_mut("experiment").unwrap().as_table_mut().unwrap();
    e.remove("name");
    e.remove("storage");
    toml::to_string(&doc).unwrap()
}

#[test]
fn python_and_toml_build_the_same_sweep_from_the_same_settings() {
    let space = "lr = { loguniform = [1e-4, 1e-1] }\nlayers = { randint = [1, 4] }\nact = { choice = [\"relu\", \"tanh\"] }\n";
    for (which, scheduler) in [
        ("asha", "type = \"asha\"\ntime_attr = \"samples\"\nmax_t = 300\nreduction_factor = 3\n"),
        ("hyperband", "type = \"hyperband\"\nmax_t = 3\n"),
        (
            "pbt",
            "type = \"pbt\"\ntime_attr = \"training_iteration\"\nperturbation_interval = 1\n\
             [scheduler.hyperparam_mutations]\nlr = { loguniform = [1e-4, 1e-1] }\n",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let storage = dir.path().join("runs");
        passed(torch_python(dir.path(), "tests/py/ray_frontends.py", &[storage.to_str().unwrap(), which], &[]));
        // The TOML a user writes for the same sweep: Ray's defaults are the binary's; the
        // checkpoint frequency is the scheduler's business.
        let pausing = if which == "asha" { "" } else { "frequency = 1\n" };
        let toml = format!(
            "[experiment]\nname = \"t\"\nmetric = \"loss\"\nmode = \"min\"\nnum_samples = 4\nseed = 3\n\n[space]\n{space}\n\
             [stop]\ntraining_iteration = 3\n\n[checkpoint]\nnum_to_keep = 2\n{pausing}\n[scheduler]\n{scheduler}\n\
             [trainer]\ncommand = [\"{}\"]\n",
            worker()
        );
        write(dir.path(), &toml);
        // Only its resolved file matters here (the fixture's trials report no `samples`).
        let _ = nestor(dir.path(), &["run", "sweep.toml", "--storage", "toml", "--plain"]);
        let from_python = what_it_does(&storage.join(which));
        let from_toml = what_it_does(&dir.path().join("toml/t"));
        assert_eq!(from_python, from_toml, "{which}: the Python sweep differs from the TOML one");
    }
}

#[test]
fn a_scaling_config_in_param_space_gives_each_trial_its_workers() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let out = passed(torch_python(dir.path(), "tests/py/ray_behaviours.py", &[storage.to_str().unwrap(), "scaling"], &[]));
    let got: BTreeMap<String, Value> = serde_json::from_str(line(&out, "SCALING")).unwrap();
    assert_eq!(got.len(), 6);
    for (id, t) in &got {
        let asked = t["config"]["scaling_config"]["num_workers"].as_u64().unwrap();
        if asked == 5 {
            // 5 x 0.5 CPU on a 2-CPU node: refused by name, not left waiting.
            assert_eq!(t["status"], "ERROR", "{id}: {t}");
            let error = t["error"].as_str().unwrap();
            assert!(error.contains("5 workers (config scaling_config.num_workers)") && error.contains("can never start"), "{error}");
        } else {
            assert_eq!(t["status"], "TERMINATED", "{id}: {t}");
            // Every rank of the trial saw the trial's own world size.
            assert_eq!(t["history"][0]["world"].as_f64(), Some(asked as f64), "{id}: {t}");
        }
    }
}

#[test]
fn train_v2s_tune_pattern_runs_a_trainer_per_trial_and_asha_stops_them() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let out = passed(torch_python(dir.path(), "tests/py/ray_v2.py", &[storage.to_str().unwrap()], &[]));
    let got: BTreeMap<String, Value> = serde_json::from_str(line(&out, "TRIALS")).unwrap();
    assert_eq!(got.len(), 4);
    let mut stopped_early = 0;
    for (id, t) in &got {
        assert_eq!(t["status"], "TERMINATED", "{id}: {t}");
        let history = t["history"].as_array().unwrap();
        // Every result came from the trainer's two ranks, through TuneReportCallback,
        // ranks the sweep's own driver started (no second binary, no second store).
        assert!(history.iter().all(|h| h[2] == 2.0), "{id}: {t}");
        assert!(history.iter().all(|h| h[3] == 0.0), "{id}: a second nestor started the trainer's ranks: {t}");
        let inner = storage.join("v2/trials").join(id).join("train/train");
        assert!(!inner.join("store").exists(), "{id}: the trainer's run has a store of its own");
        let results = std::fs::read_to_string(inner.join("result.jsonl")).unwrap();
        let inner_results = results.lines().count();
        if history.len() < 8 {
            stopped_early += 1;
            // ASHA stopped the trial: its trainer's run was stopped too, not run to its end.
            assert!(inner_results < 8, "{id}: its trainer ran on to {inner_results} results");
        } else {
            assert_eq!(inner_results, 8, "{id}");
        }
    }
    assert!(stopped_early >= 2, "ASHA stopped {stopped_early} trials: {got:?}");
    assert!(processes_mentioning(dir.path().to_str().unwrap()).is_empty(), "a process of a trainer's run outlived it");
}

#[test]
fn a_trainer_inside_a_trial_restarts_from_its_checkpoint_and_a_restarted_trial_resumes_its_trainer() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, logs) = (dir.path().join("runs"), dir.path().join("logs"));
    std::fs::create_dir_all(&logs).unwrap();
    let out = passed(torch_python(dir.path(), "tests/py/ray_v2_faults.py", &[storage.to_str().unwrap(), logs.to_str().unwrap()], &[]));
    let got: BTreeMap<String, Value> = serde_json::from_str(line(&out, "TRIALS")).unwrap();
    for (fault, t) in &got {
        assert_eq!(t["status"], "TERMINATED", "{fault}: {t}");
        assert_eq!(t["last"], 6.0, "{fault}: {t}");
    }
    let seen =
        |fault: &str| -> Value { serde_json::from_str(&std::fs::read_to_string(logs.join(format!("{fault}.json"))).unwrap()).unwrap() };
    // A rank died at step 4: the trainer's ranks started again from checkpoint 3, once.
    let rank = seen("rank");
    assert_eq!(rank["restarts"], 1, "{rank}");
    assert_eq!(rank["steps"], serde_json::json!([1, 2, 3, 4, 5, 6]), "{rank}");
    assert!(rank["checkpoint"].as_str().unwrap().ends_with("checkpoint_000006"), "{rank}");
    // num_to_keep = 2: the latest two are left on disk, committed.
    let run = Path::new(rank["path"].as_str().unwrap());
    let kept: BTreeSet<String> = std::fs::read_dir(run)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint_"))
        .collect();
    assert_eq!(kept, BTreeSet::from(["checkpoint_000005".to_string(), "checkpoint_000006".to_string()]), "{run:?}");
    assert!(run.join("checkpoint_000006/.committed").is_file());
    // The trial's function failed after step 3 and ran again: its trainer went on from its
    // latest committed checkpoint (step 3, or a later one its ranks reached before they were stopped).
    let trial = seen("trial");
    assert_eq!(trial["restarts"], 0, "{trial}");
    let steps: Vec<u64> = trial["steps"].as_array().unwrap().iter().map(|s| s.as_u64().unwrap()).collect();
    assert!(steps.first().is_some_and(|&s| s >= 4), "{trial}: the restarted trial's trainer started over");
    assert_eq!(steps, (steps[0]..=6).collect::<Vec<_>>(), "{trial}");
    let id = got["trial"]["id"].as_str().unwrap();
    assert_eq!(Path::new(trial["path"].as_str().unwrap()), storage.join("faults/trials").join(id).join("train/train"));
    assert!(processes_mentioning(dir.path().to_str().unwrap()).is_empty(), "a process of a trainer's run outlived it");
}

#[test]
fn a_trials_resources_become_its_trainers_scaling_config() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, logs) = (dir.path().join("runs"), dir.path().join("logs"));
    std::fs::create_dir_all(&logs).unwrap();
    let args = [storage.to_str().unwrap(), logs.to_str().unwrap(), "fits"];
    let out = passed(torch_python(dir.path(), "tests/py/ray_v2_booking.py", &args, &[]));
    let got: BTreeMap<String, Value> = serde_json::from_str(line(&out, "TRIALS")).unwrap();
    assert_eq!(got.len(), 4);
    for (id, t) in &got {
        assert_eq!(t["status"], "TERMINATED", "{id}: {t}");
        assert_eq!(t["results"], 3, "{id}: {t}");
    }
    // 2 CPUs, trainers of 2 x 1 CPU: one trainer at a time, though nothing
    // but the booking limits the trials (no max_concurrent_trials).
    let mut runs: Vec<(f64, f64, String)> = Vec::new();
    for lr in ["0.1", "0.2", "0.4", "0.8"] {
        let mut began = f64::INFINITY;
        let mut ended = 0f64;
        for rank in 0..2 {
            let text = std::fs::read_to_string(logs.join(format!("{lr}-rank{rank}.json"))).unwrap();
            let v: Value = serde_json::from_str(&text).unwrap();
            began = began.min(v["began"].as_f64().unwrap());
            ended = ended.max(v["ended"].as_f64().unwrap());
            // The run saw the GPUs its trial booked: none.
            assert_eq!(v["cuda"], "", "{lr} rank {rank}: {v}");
        }
        runs.push((began, ended, lr.to_string()));
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    for pair in runs.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "the trainers of lr={} and lr={} ran at once: {runs:?}", pair[0].2, pair[1].2);
    }
    // Each trial holds its trainer's two bundles.
    let status = nestor(dir.path(), &["status", storage.join("booked").to_str().unwrap()]);
    let text = String::from_utf8_lossy(&status.stdout);
    for id in got.keys() {
        let row = text.lines().find(|l| l.starts_with(id.as_str())).unwrap_or_else(|| panic!("{id} in {text}"));
        assert_eq!(row.split_whitespace().nth(6), Some("2"), "{id}'s workers: {row}");
    }

    // A trainer that can never fit fails its trial, naming why; the sweep goes on.
    let storage = dir.path().join("never");
    let args = [storage.to_str().unwrap(), logs.to_str().unwrap(), "never"];
    let out = passed(torch_python(dir.path(), "tests/py/ray_v2_booking.py", &args, &[]));
    let got: BTreeMap<String, Value> = serde_json::from_str(line(&out, "TRIALS")).unwrap();
    assert_eq!(got.len(), 4);
    for (id, t) in &got {
        assert_eq!(t["status"], "ERROR", "{id}: {t}");
        let error = t["error"].as_str().unwrap();
        assert!(error.contains("ScalingConfig") && error.contains("never start"), "{id}: {error}");
    }
}

#[test]
fn num_to_keep_with_a_score_keeps_the_best_checkpoint_and_the_latest() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let out = passed(torch_python(dir.path(), "tests/py/ray_behaviours.py", &[storage.to_str().unwrap(), "keep"], &[]));
    let got: Value = serde_json::from_str(line(&out, "KEEP")).unwrap();
    assert_eq!(got["best_step"], "3", "{got}");
    assert_eq!(got["latest_step"], "6", "{got}");
    let t = got["trials"].as_object().unwrap().values().next().unwrap();
    let kept: Vec<&str> = t["checkpoints"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(kept.len(), 2, "{t}");
    assert!(kept[0].ends_with("checkpoint_000003") && kept[1].ends_with("checkpoint_000006"), "{kept:?}");
    // The others are gone from the disk too.
    let trial_dir = Path::new(kept[0]).parent().unwrap();
    let on_disk: BTreeSet<String> = std::fs::read_dir(trial_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint_"))
        .collect();
    assert_eq!(on_disk, BTreeSet::from(["checkpoint_000003".to_string(), "checkpoint_000006".to_string()]));
}

#[test]
fn a_torch_trainers_process_group_is_up_before_its_function_with_one_worker_and_two() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let out = passed(torch_python(dir.path(), "tests/py/ray_behaviours.py", &[storage.to_str().unwrap(), "torch"], &[]));
    for (key, world, sum) in [("TORCH1", 1.0, 1.0), ("TORCH2", 2.0, 3.0)] {
        let history: Vec<Value> = serde_json::from_str(line(&out, key)).unwrap();
        assert_eq!(history.len(), 3, "{key}: {history:?}");
        for h in &history {
            assert_eq!(h["world"], world, "{key}: {h}");
            assert_eq!(h["sum"], sum, "{key}: all_reduce over the ranks: {h}");
            assert_eq!(h["backend"], "gloo", "{key}: {h}");
        }
        let first = history[0]["loss"].as_f64().unwrap();
        let last = history[2]["loss"].as_f64().unwrap();
        assert!(last < first, "{key}: the FSDP-sharded model learnt nothing: {history:?}");
    }
}

#[test]
fn a_class_trainable_sweep_killed_with_its_driver_is_restored_losing_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let acks = dir.path().join("acks.txt");
    let env = [("ACKS", acks.display().to_string())];
    let cmd = torch_python_cmd(dir.path(), "tests/py/ray_class.py", &[storage.to_str().unwrap(), "crash", "run"], &env);
    let acked = trial_iterations(&kill_driver_midway(cmd, &acks, 12, &storage));
    let out = passed(torch_python(dir.path(), "tests/py/ray_class.py", &[storage.to_str().unwrap(), "crash", "restore"], &env));
    let got: BTreeMap<String, Value> = serde_json::from_str(line(&out, "TRIALS")).unwrap();
    assert_eq!(got.len(), 4);
    for (id, t) in &got {
        assert_eq!(t["status"], "TERMINATED", "{id}: {t}");
        let iterations: Vec<u64> = history(t).iter().map(|h| h.0).collect();
        assert_eq!(iterations, (1..=30).collect::<Vec<u64>>(), "{id}: every iteration once, in order");
        assert_state_carried(id, t);
    }
    for (trial, iteration) in &acked {
        assert!(history(&got[trial]).iter().any(|h| h.0 == *iteration), "acknowledged {trial} {iteration} is missing");
    }
}

/// tests/py/ray_utils.py's `scenario`, experiments in `dir/runs`: its stdout.
fn utils_script(dir: &Path, scenario: &str) -> String {
    let storage = dir.join("runs");
    passed(torch_python(dir, "tests/py/ray_utils.py", &[storage.to_str().unwrap(), scenario], &[]))
}

/// Ray's optuna_multiobjective_example's shape: `OptunaSearch` over two
/// metrics of opposite modes runs Optuna's study of two directions, which
/// is told both metrics' last values of every trial; the configs are the
/// study's (a choice of dicts, constants kept); `get_best_result` takes
/// either metric; a `TuneConfig` of several metrics is refused naming them.
#[test]
fn optuna_search_over_two_metrics_tells_the_study_both() {
    let dir = tempfile::tempdir().unwrap();
    let out = utils_script(dir.path(), "multiobjective");
    let got: Value = serde_json::from_str(line(&out, "MULTI")).unwrap();
    assert_eq!(got["directions"], serde_json::json!(["MINIMIZE", "MAXIMIZE"]));
    let told = got["told"].as_array().unwrap();
    assert_eq!(told.len(), 8, "{got}");
    // Every trial's two last values reached the study, in the order of the metrics.
    let mut last: Vec<(f64, f64)> =
        got["last"].as_array().unwrap().iter().map(|m| (m["loss"].as_f64().unwrap(), m["gain"].as_f64().unwrap())).collect();
    let mut values: Vec<(f64, f64)> = told
        .iter()
        .map(|t| {
            assert_eq!(t["state"], "COMPLETE", "{t}");
            (t["values"][0].as_f64().unwrap(), t["values"][1].as_f64().unwrap())
        })
        .collect();
    last.sort_by(|a, b| a.0.total_cmp(&b.0));
    values.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(last, values);
    for c in got["configs"].as_array().unwrap() {
        let (w, h, n) = (c["width"].as_f64().unwrap(), c["height"].as_f64().unwrap(), c["n"].as_i64().unwrap());
        assert!((0.0..=20.0).contains(&w) && (-100.0..=100.0).contains(&h) && (1..=3).contains(&n), "{c}");
        assert_eq!(c["steps"], 5, "{c}");
        assert!(c["kind"] == serde_json::json!({"name": "a"}) || c["kind"] == serde_json::json!({"name": "b"}), "{c}");
    }
    let best_loss = values.iter().map(|v| v.0).fold(f64::INFINITY, f64::min);
    let best_gain = values.iter().map(|v| v.1).fold(f64::NEG_INFINITY, f64::max);
    assert_eq!((got["best"]["loss"].as_f64().unwrap(), got["best"]["gain"].as_f64().unwrap()), (best_loss, best_gain));
    let refused: String = serde_json::from_str(line(&out, "REFUSED")).unwrap();
    assert!(refused.contains("mode"), "{refused}");
}

/// Ray's hyperband_example's shape: `MyTrainableClass` from
/// `tune.utils.mock_trainable` under HyperBand, paused and resumed through
/// its checkpoints (each reward is the curve at the trial's iteration, so
/// its step count came back whole); `validate_save_restore` passes it and
/// names what a trainable that keeps no state loses; the nested-dict helpers.
#[test]
fn the_mock_trainable_and_tunes_helpers_work_as_rays_examples_use_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = utils_script(dir.path(), "mock");
    let trials: BTreeMap<String, Value> = serde_json::from_str(line(&out, "TRIALS")).unwrap();
    assert_eq!(trials.len(), 6);
    for (id, t) in &trials {
        let (w, h) = (t["config"]["width"].as_f64().unwrap(), t["config"]["height"].as_f64().unwrap());
        let it = t["iteration"].as_f64().unwrap();
        assert_eq!(t["timesteps"].as_f64().unwrap(), it, "{id}: {t}");
        assert!((t["reward"].as_f64().unwrap() - h * (it / w).tanh()).abs() < 1e-9, "{id}: {t}");
    }
    assert!(trials.values().any(|t| t["iteration"] == 9), "no trial reached max_t: {trials:?}");
    let exp = dir.path().join("runs/hyperband");
    assert!(trials_resumed(dir.path(), &exp) > 0, "HyperBand resumed no trial");
    let checks: Value = serde_json::from_str(line(&out, "CHECKS")).unwrap();
    assert_eq!(checks["mock"], true);
    let forgetful = checks["forgetful"].as_str().unwrap();
    assert!(forgetful.contains("Forgetful") && forgetful.contains("lose state") && forgetful.contains("{'n': 1}"), "{forgetful}");
    assert_eq!(checks["flat"], serde_json::json!({"a/b": 1, "a/c/d": [1, 2], "e": 2}));
    assert_eq!((checks["round_trip"].clone(), checks["lookup"].clone()), (Value::Bool(true), serde_json::json!([1, 2])));
    assert_eq!(checks["merged"], serde_json::json!({"a": {"b": 1, "c": 2}, "x": 1}));
    assert!(checks["deep_update"].as_str().unwrap().contains("Unknown config parameter `b`"), "{checks}");
}

/// How many of the experiment's trials were resumed at least once.
fn trials_resumed(dir: &Path, exp: &Path) -> usize {
    trials(dir, exp).iter().filter(|t| t["resumes"].as_u64().unwrap_or(0) > 0).count()
}

/// `tune.with_resources(fn, PlacementGroupFactory([{"CPU": 1}, {"CPU": 1}]))`
/// from Ray's `tune.execution.placement_groups`: the trial gets both
/// bundles' CPUs (its ranks' threads set to them), `get_trial_resources()`
/// answers with a factory read by attribute or as a dict, and a bad
/// bundle is refused naming it.
#[test]
fn a_placement_group_factory_gives_a_trial_its_bundles_in_all() {
    let dir = tempfile::tempdir().unwrap();
    let out = utils_script(dir.path(), "resources");
    let got: Value = serde_json::from_str(line(&out, "RESOURCES")).unwrap();
    assert_eq!(got, serde_json::json!({"head_cpus": 2.0, "cpus": 2.0, "bundles": 1.0, "omp": 2.0}));
    let refused: String = serde_json::from_str(line(&out, "REFUSED")).unwrap();
    assert!(refused.contains("bundles[0]['CPU'] = -1"), "{refused}");
}

/// `HyperOptSearch` from `ray.tune.search.hyperopt` over a `param_space`,
/// through a `ConcurrencyLimiter`: nestor's TPE with HyperOpt's settings
/// (its random start, its seed as the sweep's), the sweep runs to its
/// samples; a HyperOpt `hp` space is refused saying what to give instead.
#[test]
fn hyperopt_search_runs_nestors_tpe_with_its_settings() {
    let dir = tempfile::tempdir().unwrap();
    let out = utils_script(dir.path(), "hyperopt");
    let got: Value = serde_json::from_str(line(&out, "HYPEROPT")).unwrap();
    assert_eq!(got["trials"], 12);
    let sweep: toml::Table = got["sweep"].as_str().unwrap().parse().unwrap();
    assert_eq!(sweep["search"]["algorithm"].as_str(), Some("tpe"), "{sweep}");
    assert_eq!(sweep["search"]["n_startup_trials"].as_integer(), Some(4), "{sweep}");
    assert_eq!(sweep["search"]["max_concurrent"].as_integer(), Some(2), "{sweep}");
    assert_eq!(sweep["experiment"]["seed"].as_integer(), Some(11), "the searcher's seed is the sweep's: {sweep}");
    assert!(got["best"].as_f64().unwrap() < 0.2, "{got}");
    let refused: String = serde_json::from_str(line(&out, "REFUSED")).unwrap();
    assert!(refused.contains("HyperOptSearch(space=...)") && refused.contains("param_space"), "{refused}");
}
