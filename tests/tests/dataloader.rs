//! A torch `DataLoader` with 4 worker processes inside each rank of a
//! 2-rank DDP run, in every way a rank starts: forked from the warm
//! process, a fresh interpreter, a `TorchTrainer.fit()` inside a Tune
//! trial, a TOML sweep's command, a Slurm step in an allocation and a
//! Slurm job of its own (tests/py/dataloader_ranks.py). The workers fork
//! while the rank's channel to the driver is open and gRPC's threads may
//! be busy (a Lightning Trainer's loaders do, right after a report): with
//! gRPC's fork handling on, that child died ("DataLoader worker exited
//! unexpectedly"); nestor turns it off in its ranks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::python::{line, on_two_slurm_nodes, passed, repo, torch_python, torch_python_cmd, torch_venv};
use common::*;
use serde_json::Value;

const EPOCHS: u64 = 3;
/// Items of the data set; each rank sees half of them an epoch.
const SAMPLES: u64 = 512;

/// Checks what each rank saw: its half of the data each epoch, through 4
/// worker processes of its own, the same 4 every epoch (persistent), and
/// for the plain torch loop an evaluation pass whose 4 workers are new
/// each epoch.
fn assert_ranks_loaded(out: &str, lightning: bool) {
    let got: Value = serde_json::from_str(line(out, "RANKS")).unwrap();
    let ranks = got["ranks"].as_object().unwrap();
    assert_eq!(ranks.len(), 2 * EPOCHS as usize, "each rank wrote each epoch: {got}");
    for rank in 0..2 {
        let mut workers = BTreeSet::new();
        let mut eval_workers = BTreeSet::new();
        for epoch in 1..=EPOCHS {
            let r = &ranks[&format!("rank-{rank}-epoch-{epoch}")];
            assert_eq!(r["seen"].as_u64(), Some(SAMPLES / 2), "rank {rank}, epoch {epoch}: its half of the data: {r}");
            let pids: BTreeSet<u64> = r["pids"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap()).collect();
            assert_eq!(pids.len(), 4, "rank {rank}, epoch {epoch}: 4 DataLoader workers made the batches: {r}");
            assert!(!pids.contains(&r["me"].as_u64().unwrap()), "the batches came from worker processes, not the rank");
            workers.extend(pids);
            if !lightning {
                assert_eq!(r["evaluated"].as_u64(), Some(SAMPLES), "rank {rank}, epoch {epoch}: the evaluation pass: {r}");
                let eval: Vec<u64> = r["eval_pids"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap()).collect();
                assert_eq!(eval.len(), 4, "{r}");
                eval_workers.extend(eval);
            }
        }
        assert_eq!(workers.len(), 4, "rank {rank}: persistent workers are the same 4 each epoch");
        if !lightning {
            assert_eq!(eval_workers.len(), 4 * EPOCHS as usize, "rank {rank}: the evaluation loader's workers are new each epoch");
        }
    }
    let metrics = &got["metrics"];
    assert_eq!(metrics["epoch"].as_f64(), Some(if lightning { EPOCHS - 1 } else { EPOCHS } as f64), "{got}");
}

fn run(mode: &str, lightning: bool) {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let mut args = vec![storage.to_str().unwrap(), mode];
    if lightning {
        args.push("lightning");
    }
    let out = passed(torch_python(dir.path(), "tests/py/dataloader_ranks.py", &args, &[]));
    assert_ranks_loaded(&out, lightning);
}

#[test]
fn a_dataloader_with_four_workers_runs_in_ranks_forked_from_the_warm_process() {
    run("warm", false);
    run("warm", true);
}

#[test]
fn a_dataloader_with_four_workers_runs_in_ranks_started_cold() {
    run("cold", false);
    run("cold", true);
}

#[test]
fn a_dataloader_with_four_workers_runs_in_a_trainer_inside_a_trial() {
    run("in-trial", true);
}

#[test]
fn a_dataloader_with_four_workers_runs_in_a_toml_sweeps_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("ranks");
    let sweep = format!(
        r#"[experiment]
name = "dl-toml"
metric = "val_loss"
mode = "min"

[space]
out = "{out}"
lightning = true

[trainer]
command = ["{python}", "{script}", "--worker"]
num_workers = 2
resources_per_worker = {{ CPU = 0.5 }}
"#,
        out = out_dir.display(),
        python = torch_venv().join("bin/python").display(),
        script = repo().join("tests/py/dataloader_ranks.py").display(),
    );
    write(dir.path(), &sweep);
    let mut c = std::process::Command::new(nestor_bin());
    c.args(["run", "sweep.toml", "--storage", "runs", "--plain"]).current_dir(dir.path());
    let run = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "{stderr}");
    let mut ranks = serde_json::Map::new();
    for entry in std::fs::read_dir(&out_dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        ranks.insert(name, serde_json::from_str(&read(&path)).unwrap());
    }
    let grid = tuner::ResultGrid::load(&dir.path().join("runs/dl-toml")).unwrap();
    let epoch = grid.iter().next().unwrap().metrics.as_ref().unwrap().get("epoch").copied().unwrap();
    let got = serde_json::json!({"ranks": ranks, "metrics": {"epoch": epoch}});
    assert_ranks_loaded(&format!("RANKS {got}"), true);
    // The ranks' output reached the driver's console, each line behind its rank.
    assert!(stderr.contains("(trial_00000 rank 1) "), "{stderr}");
    let context: Value = serde_json::from_str(&read(&dir.path().join("context.json"))).unwrap();
    assert_eq!(context["experiment"], "dl-toml", "{context}");
    assert_eq!(context["storage"].as_str().unwrap(), dir.path().join("runs").canonicalize().unwrap().to_str().unwrap(), "{context}");
    assert_eq!((context["local_world_size"].as_u64(), context["node_rank"].as_u64()), (Some(2), Some(0)), "{context}");
}

#[test]
fn a_dataloader_with_four_workers_runs_in_ranks_of_a_slurm_step() {
    let dir = tempfile::tempdir().unwrap();
    let out = on_two_slurm_nodes("dataloader_ranks.py", dir.path(), &["warm", "lightning"]);
    assert_ranks_loaded(&out, true);
}

#[test]
fn a_dataloader_with_four_workers_runs_in_ranks_of_a_slurm_job_of_their_own() {
    let options = common::slurm::Options { networks: true, conf: "MinJobAge=300\nDefMemPerCPU=200".into(), ..Default::default() };
    let cluster = common::slurm::SlurmCluster::start_with(2, 2, 4000, options);
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("runs");
    let mut c = torch_python_cmd(dir.path(), "tests/py/dataloader_ranks.py", &[storage.to_str().unwrap(), "slurm-jobs"], &[]);
    c.env("SLURM_CONF", cluster.conf());
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(stderr.contains("a Slurm job per trial run"), "{stderr}");
    assert_ranks_loaded(&passed(out), false);
}
