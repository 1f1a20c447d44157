//! The deep-learning frameworks on `TorchTrainer`, for real: Hugging Face
//! Transformers, Lightning, FSDP (`prepare_model(parallel_strategy="fsdp")`
//! with a sharded checkpoint) and Accelerate, 2 ranks each on gloo, in the
//! cached torch environment (examples/torch_ddp/venv.sh installs them).
//! Models come from configs with random weights: nothing is downloaded.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::python::*;
use common::*;
use serde_json::Value;

/// The `RESULT` lines of a run of tests/py/frameworks.py.
fn results(out: &str) -> Vec<Value> {
    out.lines().filter_map(|l| l.strip_prefix("RESULT ")).map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The `RANK` lines of one rank's log, and the log.
fn rank_lines(trial_dir: &Path, rank: u32) -> (Vec<Value>, String) {
    let log = read(&trial_dir.join(format!("logs/rank-{rank}.log")));
    (log.lines().filter_map(|l| l.strip_prefix("RANK ")).map(|l| serde_json::from_str(l).unwrap()).collect(), log)
}

fn script(dir: &Path, args: &[&str]) -> String {
    let storage = dir.join("s");
    let mut all = vec![storage.to_str().unwrap()];
    all.extend_from_slice(args);
    passed(torch_python(dir, "tests/py/frameworks.py", &all, &[]))
}

/// A sweep of 2 trials whose framework would go on, stopped by ASHA at
/// its second report: every report came through the framework's callback
/// with the evaluation's metric, each trial stopped at iteration 2, and
/// both ranks of each left the framework's loop themselves at that step
/// (no traceback, no rank left behind).
fn stopped_by_asha(mode: &str, metric: &str, end_key: &str, end: u64) {
    let dir = tempfile::tempdir().unwrap();
    let out = script(dir.path(), &[mode]);
    let exp = dir.path().join("s").join(mode);
    let grid = tuner::ResultGrid::load(&exp).unwrap();
    assert_eq!(grid.len(), 2, "{out}");
    for t in grid.iter() {
        assert_eq!(t.status, tuner::TrialStatus::Terminated, "{}: {:?}", t.trial_id, t.error);
        let iters: Vec<u64> = t.history.iter().map(|r| r.training_iteration).collect();
        assert_eq!(iters, [1, 2], "{}: ASHA(max_t=2) stops at the second report", t.trial_id);
        for r in &t.history {
            assert!(r.metrics.get(metric).is_some_and(|v| v.is_finite()), "{} reported no {metric}: {:?}", t.trial_id, r.metrics);
            assert!(r.checkpoint.is_some(), "{}: a report without its checkpoint", t.trial_id);
        }
        for rank in 0..2 {
            let (lines, log) = rank_lines(&t.path, rank);
            assert!(!log.contains("Traceback"), "{} rank {rank}:\n{log}", t.trial_id);
            let ended = lines.iter().find_map(|l| l.get(end_key)).unwrap_or_else(|| panic!("rank {rank} never left the loop:\n{log}"));
            assert_eq!(ended.as_u64(), Some(end), "{} rank {rank}", t.trial_id);
        }
    }
    assert_eq!(results(&out).len(), 2);
    assert!(processes_mentioning(dir.path().to_str().unwrap()).is_empty(), "a worker survived");
}

#[test]
fn hugging_face_trials_report_at_each_save_and_asha_ends_their_trainer_cleanly() {
    // 4 evaluations a trial (16 steps, every 4): stopped after the second, at step 8.
    stopped_by_asha("hf-stop", "eval_loss", "ended_at_step", 8);
}

#[test]
fn lightning_trials_report_at_each_epoch_and_asha_ends_their_fit_cleanly() {
    // 6 epochs a trial: fit() ends after the second (current_epoch 2).
    stopped_by_asha("pl-stop", "val_loss", "ended_at_epoch", 2);
}

/// One run killed at its rank 1 after its second checkpoint, and the same
/// run uninterrupted: the killed one restarts from the framework's own
/// checkpoint (every rank's files of it) and ends with the same numbers.
fn a_killed_rank_resumes_from_the_frameworks_checkpoint(mode: &str, reports: u64, keys: &[&str], files: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("s");
    let env = [("SLOW_S", "0.3".to_string())];
    let mut run = torch_python_cmd(dir.path(), "tests/py/frameworks.py", &[storage.to_str().unwrap(), mode, "killed"], &env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let trial_dir = storage.join("killed/trials/trial_00000");
    wait_for_run("checkpoint 2 committed", 120.0, &mut run, || trial_dir.join("checkpoint_000002/.committed").exists());
    // A rank is a fork of the warm process: its pid is in its log.
    let (lines, log) = rank_lines(&trial_dir, 1);
    let victim = lines.iter().find_map(|l| l.get("pid")).unwrap_or_else(|| panic!("rank 1 is running:\n{log}"));
    let victim = u32::try_from(victim.as_u64().unwrap()).unwrap();
    signal(victim, libc::SIGKILL);
    let out = run.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("rank 1 was killed by signal 9"), "{text}");
    script(dir.path(), &[mode, "reference"]);

    let killed = tuner::ResultGrid::load(&storage.join("killed")).unwrap();
    let reference = tuner::ResultGrid::load(&storage.join("reference")).unwrap();
    let (k, r) = (killed.get("trial_00000").unwrap(), reference.get("trial_00000").unwrap());
    assert_eq!((k.failures, k.restarts, r.failures), (1, 1, 0));
    let iters: Vec<u64> = k.history.iter().map(|x| x.training_iteration).collect();
    assert_eq!(iters, (1..=reports).collect::<Vec<_>>());
    for key in keys {
        let (a, b) = (k.metrics.as_ref().unwrap()[*key], r.metrics.as_ref().unwrap()[*key]);
        assert_eq!(a, b, "{key}: restarted {a} vs uninterrupted {b}");
    }
    // Each rank of the new run saw the whole checkpoint: rank 0's model and the others' own files.
    for rank in 0..2 {
        let (lines, log) = rank_lines(&trial_dir, rank);
        let resumed = lines.iter().find_map(|l| l.get("resumed")).unwrap_or_else(|| panic!("rank {rank} did not resume:\n{log}"));
        let names: Vec<&str> = resumed.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        for f in files {
            assert!(names.contains(f), "rank {rank} resumed without {f}: {names:?}");
        }
    }
    assert!(processes_mentioning(dir.path().to_str().unwrap()).is_empty(), "a worker survived");
}

#[test]
fn a_hugging_face_rank_killed_mid_run_resumes_from_the_trainers_checkpoint_and_ends_as_an_uninterrupted_run() {
    // 12 steps, a save every 3: 4 reports. The checkpoint/ folder holds the
    // model, the optimizer and each rank's random state.
    a_killed_rank_resumes_from_the_frameworks_checkpoint(
        "hf-run",
        4,
        &["eval_loss", "loss", "step"],
        &["model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"],
    );
}

#[test]
fn a_lightning_rank_killed_mid_run_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_run() {
    a_killed_rank_resumes_from_the_frameworks_checkpoint("pl-run", 5, &["val_loss", "train_loss", "step"], &["checkpoint.ckpt"]);
}

#[test]
fn fsdp_shards_the_parameters_and_its_sharded_checkpoint_restores_into_other_numbers_of_ranks() {
    let dir = tempfile::tempdir().unwrap();
    script(dir.path(), &["fsdp", "two", "2"]);
    let two = dir.path().join("s/two/trials/trial_00000");
    let mut held = 0;
    let mut saved = None;
    for rank in 0..2 {
        let (lines, log) = rank_lines(&two, rank);
        let shape = lines.iter().find(|l| l.get("held").is_some()).unwrap_or_else(|| panic!("{log}"));
        let (h, total) = (shape["held"].as_u64().unwrap(), shape["total"].as_u64().unwrap());
        assert!(h > 0 && h < total, "rank {rank} holds {h} of {total} parameters: not a shard");
        held += h;
        let last = lines.iter().rev().find(|l| l.get("saved_sum").is_some()).unwrap();
        assert_eq!(last["epoch"].as_u64(), Some(3));
        let files: Vec<&str> = last["files"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert!(files.contains(&format!("__{rank}_0.distcp").as_str()), "rank {rank} saved {files:?}");
        saved = Some(last["saved_sum"].as_f64().unwrap());
        if rank == 0 {
            assert_eq!(held, h);
        } else {
            assert_eq!(held, shape["total"].as_u64().unwrap(), "the ranks' shards add up to the model");
        }
    }
    // The committed checkpoint holds each rank's part; a new run on 3 ranks,
    // then one on 1, loads it (resharded) and goes on from epoch 3.
    let checkpoint = two.join("checkpoint_000003");
    assert!(checkpoint.join("rank-0/.metadata").is_file() && checkpoint.join("rank-1/__1_0.distcp").is_file());
    for (name, n) in [("three", 3u32), ("one", 1)] {
        let out = passed(torch_python(
            dir.path(),
            "tests/py/frameworks.py",
            &[dir.path().join("s").to_str().unwrap(), "fsdp", name, &n.to_string(), checkpoint.to_str().unwrap()],
            &[("EPOCHS", "4".to_string())],
        ));
        let result = &results(&out)[0];
        assert_eq!(result["metrics"]["epoch"].as_f64(), Some(4.0), "{out}");
        let trial = dir.path().join(format!("s/{name}/trials/trial_00000"));
        for rank in 0..n {
            let (lines, log) = rank_lines(&trial, rank);
            let resumed = lines.iter().find(|l| l.get("resumed_epoch").is_some()).unwrap_or_else(|| panic!("{log}"));
            assert_eq!(resumed["resumed_epoch"].as_u64(), Some(3));
            assert_eq!(resumed["loaded_sum"].as_f64(), saved, "{name} rank {rank} loaded other parameters than were saved");
            let world = lines.iter().find(|l| l.get("world").is_some()).unwrap();
            assert_eq!(world["world"].as_u64(), Some(u64::from(n)));
        }
    }
}

#[test]
fn an_accelerate_loop_runs_across_the_trials_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let out = script(dir.path(), &["accelerate"]);
    let m = &results(&out)[0]["metrics"];
    // Accelerate read the trial's ranks from the environment nestor set: 2
    // processes, each a half of the 8 batches, the model wrapped in DDP and
    // the ranks' weights equal after training.
    assert_eq!(m["num_processes"].as_f64(), Some(2.0), "{out}");
    assert_eq!(m["process_index"].as_f64(), Some(0.0));
    assert_eq!(m["batches"].as_f64(), Some(4.0));
    assert_eq!(m["wrapped"].as_str(), Some("DistributedDataParallel"));
    assert_eq!(m["in_sync"].as_f64(), Some(1.0));
}

/// An example of examples/python/, run as a user runs it.
fn example(name: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs").display().to_string();
    let env = [("EXAMPLE_STORAGE", storage)];
    let mut cmd = torch_python_cmd(dir.path(), &format!("examples/python/{name}"), &[], &env);
    let out = passed(cmd.output().unwrap());
    assert!(processes_mentioning(dir.path().to_str().unwrap()).is_empty(), "a worker survived");
    out
}

#[test]
fn the_hugging_face_example_sweeps_under_asha_and_its_best_checkpoint_loads_with_from_pretrained() {
    let out = example("tune_huggingface.py");
    let (loss, step) = line(&out, "best eval_loss:").split_once(" at step ").unwrap();
    assert!(loss.parse::<f64>().unwrap().is_finite(), "{out}");
    assert!(["4", "8", "12", "16"].contains(&step), "a report at each evaluation (every 4 steps): {out}");
    let best = line(&out, "best checkpoint:");
    assert!(best.ends_with("(28032 parameters)"), "{out}");
}

#[test]
fn the_lightning_example_sweeps_under_asha_and_its_best_checkpoint_loads_with_load_from_checkpoint() {
    let out = example("tune_lightning.py");
    let best = line(&out, "best checkpoint:");
    let config = line(&out, "best config:");
    let hidden = if config.contains("'hidden': 32") { 32 } else { 8 };
    assert!(best.ends_with(&format!("(hidden={hidden})")), "{out}");
}

#[test]
fn fully_shard_called_directly_in_the_function_shards_over_the_trials_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let out = script(dir.path(), &["fully-shard"]);
    let m = &results(&out)[0]["metrics"];
    let (held, total) = (m["held"].as_f64().unwrap(), m["total"].as_f64().unwrap());
    assert!(held > 0.0 && held < total, "rank 0 holds {held} of {total} parameters: not a shard\n{out}");
    assert_eq!(m["epoch"].as_f64(), Some(2.0));
}

#[test]
fn the_fsdp_example_sweeps_under_asha_and_its_sharded_best_checkpoint_loads_whole_in_the_driver() {
    let out = example("tune_fsdp.py");
    // The driver loads every rank's part into one plain model: its loss is the one the trial reported.
    let reported: f64 = line(&out, "best val_loss:").split_once(" at epoch ").unwrap().0.parse().unwrap();
    let whole = line(&out, "best checkpoint:");
    let whole: f64 = whole.split("(val_loss ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().parse().unwrap();
    // Both printed to 4 decimals; the sharded and the whole model sum in another order.
    assert!((reported - whole).abs() <= 2e-4, "reported {reported}, the whole model {whole}:\n{out}");
}

#[test]
fn the_accelerate_example_sweeps_under_asha_on_two_processes_and_keeps_each_ranks_state() {
    let out = example("tune_accelerate.py");
    assert!(line(&out, "best val_loss:").ends_with("on 2 processes"), "{out}");
    let files = line(&out, "best checkpoint:");
    for f in ["model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl"] {
        assert!(files.contains(f), "the best checkpoint lacks {f}: {files}");
    }
}

#[test]
fn an_integration_without_its_framework_names_the_package_to_install() {
    for (module, blocked, extra) in [
        ("nestor.train.huggingface.transformers", "'transformers'", "huggingface"),
        ("nestor.train.lightning", "'lightning', 'lightning.pytorch', 'pytorch_lightning'", "lightning"),
    ] {
        let code = format!(
            "import sys\nfor m in ({blocked},):\n    sys.modules[m] = None\ntry:\n    import {module}\nexcept ImportError as e:\n    print(e)\nelse:\n    print('imported')\n"
        );
        let out = std::process::Command::new(torch_venv().join("bin/python")).args(["-c", &code]).output().unwrap();
        let text = passed(out);
        assert!(text.contains(&format!("pip install \"nestor[{extra}]\"")), "{module}: {text}");
    }
}

#[test]
fn tunes_lightning_callback_reports_each_validation_and_asha_ends_fit_cleanly() {
    // Ray Tune's pattern: Lightning in a function trainable, one process a trial.
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("s");
    let out = passed(torch_python(dir.path(), "tests/py/tune_lightning.py", &[storage.to_str().unwrap()], &[]));
    let results = results(&out);
    assert_eq!(results.len(), 2, "{out}");
    for r in &results {
        assert_eq!(r["iterations"], serde_json::json!([1, 2]), "ASHA(max_t=2) stops each trial at its second report: {out}");
        assert!(r["losses"].as_array().unwrap().iter().all(|l| l.as_f64().is_some_and(f64::is_finite)), "{out}");
    }
    for t in 0..2 {
        let (lines, log) = rank_lines(&storage.join(format!("tune-lightning/trials/trial_{t:05}")), 0);
        assert!(!log.contains("Traceback"), "{log}");
        assert_eq!(lines.iter().find_map(|l| l.get("ended_at_epoch")).and_then(Value::as_u64), Some(2), "{log}");
    }
}

#[test]
fn a_sharded_checkpoint_restores_whole_on_ranks_that_fetch_it_from_the_driver() {
    // Ranks that do not see the driver's directories (as on nodes sharing
    // none) fetch their checkpoint from it; a sharded one needs every
    // rank's part: rank 1 killed after the second epoch, the restarted
    // ranks fetch the whole checkpoint and end as an uninterrupted run.
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("s");
    let env = [("NESTOR_NODE_VIEW", "unshared".to_string()), ("SLOW_S", "0.5".to_string()), ("EPOCHS", "4".to_string())];
    let mut run = torch_python_cmd(dir.path(), "tests/py/frameworks.py", &[storage.to_str().unwrap(), "fsdp", "fetched", "2"], &env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let trial_dir = storage.join("fetched/trials/trial_00000");
    wait_for_run("checkpoint 2 committed", 120.0, &mut run, || trial_dir.join("checkpoint_000002/.committed").exists());
    let (lines, log) = rank_lines(&trial_dir, 1);
    let victim = u32::try_from(lines.iter().find_map(|l| l.get("pid")).unwrap_or_else(|| panic!("{log}")).as_u64().unwrap()).unwrap();
    let saved_at_2 = lines.iter().find(|l| l.get("epoch").and_then(Value::as_u64) == Some(2)).unwrap()["saved_sum"].as_f64();
    signal(victim, libc::SIGKILL);
    let out = run.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let killed = &results(&text)[0];
    let reference = &results(&passed(torch_python(
        dir.path(),
        "tests/py/frameworks.py",
        &[storage.to_str().unwrap(), "fsdp", "reference", "2"],
        &[("EPOCHS", "4".to_string())],
    )))[0];
    assert_eq!(killed["iterations"], serde_json::json!([1, 2, 3, 4]), "{text}");
    assert_eq!(killed["metrics"]["param_sum"], reference["metrics"]["param_sum"], "restarted vs uninterrupted");
    for rank in 0..2 {
        let (lines, log) = rank_lines(&trial_dir, rank);
        let resumed = lines.iter().find(|l| l.get("resumed_epoch").is_some()).unwrap_or_else(|| panic!("rank {rank}:\n{log}"));
        assert_eq!(resumed["resumed_epoch"].as_u64(), Some(2));
        let from = resumed["path"].as_str().unwrap();
        assert!(from.contains(&format!("/nestor-trial_00000-rank-{rank}-")), "rank {rank} did not fetch its shard: {from}");
        assert_eq!(resumed["loaded_sum"].as_f64(), saved_at_2, "rank {rank} loaded other parameters than were saved");
        let files: Vec<&str> = resumed["files"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        for f in [".metadata", "__0_0.distcp", "__1_0.distcp", "epoch"] {
            assert!(files.contains(&f), "rank {rank} resumed without {f}: {files:?}");
        }
    }
}
