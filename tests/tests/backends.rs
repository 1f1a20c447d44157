//! `nestor.train.backend` for real: a framework written in a test against
//! the public `Backend` / `BackendConfig` / `DataParallelTrainer` API alone
//! (tests/py/backend.py) wires the ranks of a run into a ring over plain
//! sockets, through the hooks that run in every rank.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::data::rank_lines;
use common::python::*;

fn shutdowns(dir: &std::path::Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("shutdown-"))
        .collect()
}

#[test]
fn a_third_party_backend_wires_the_ranks_into_a_ring_through_the_hooks() {
    for workers in [2u64, 3] {
        let dir = tempfile::tempdir().unwrap();
        let out = passed(torch_python(dir.path(), "tests/py/backend.py", &[dir.path().to_str().unwrap(), &workers.to_string()], &[]));
        assert!(out.contains("DONE"), "{out}");
        let lines = rank_lines(&dir.path().join(format!("runs/ring-{workers}")), workers as u32);
        let first: Vec<&serde_json::Value> = lines.iter().map(|rank| &rank[0]).collect();
        let pids: Vec<u64> = first.iter().map(|l| l["pid"].as_u64().unwrap()).collect();
        for (r, l) in first.iter().enumerate() {
            // execute: every rank's answer, in rank order, on every rank.
            let peers: Vec<u64> = l["peers"].as_array().unwrap().iter().map(|p| p[2].as_u64().unwrap()).collect();
            assert_eq!(peers, pids, "rank {r}: {l}");
            // execute_single: rank 0's answer everywhere.
            assert_eq!(l["leader"].as_str().unwrap(), format!("hello from {}", pids[0]), "rank {r}");
            // The ring works: each rank heard from the one before it.
            assert_eq!(l["from"], serde_json::json!([(r as u64 + workers - 1) % workers]), "rank {r}");
            assert_eq!(l["inside"], "1", "rank {r}: the function ran outside the config's context");
            assert_eq!(l["env_world"], workers.to_string());
        }
        let expected: BTreeSet<String> = pids.iter().enumerate().map(|(r, p)| format!("shutdown-{r}-{p}")).collect();
        assert_eq!(shutdowns(dir.path()), expected, "on_shutdown ran once on every rank");
    }
}

#[test]
fn a_backend_whose_hook_raises_fails_the_run_naming_its_error_and_still_shuts_down() {
    let dir = tempfile::tempdir().unwrap();
    let out = passed(torch_python(dir.path(), "tests/py/backend.py", &[dir.path().to_str().unwrap(), "2", "broken"], &[]));
    let failed = out.split_once("FAILED").map(|(_, rest)| rest).unwrap_or_else(|| panic!("{out}"));
    assert!(failed.contains("RingBackend.on_start failed: the ring found no peers"), "{out}");
    // The rank that failed first shut its backend down (the other may be stopped before it does).
    assert!(!shutdowns(dir.path()).is_empty(), "on_shutdown runs after a failed hook too");
}

#[test]
fn torch_trainer_is_a_backend_whose_ranks_meet_in_one_process_group_through_a_file_or_the_group() {
    // On one machine the ranks meet through a file; where the nodes share
    // none (NESTOR_NODE_VIEW=unshared: the routes of Slurm nodes without a shared
    // directory), rank 0's store address goes through the worker group.
    for (workers, meet) in [(1u64, "file"), (2, "file"), (3, "file"), (2, "driver")] {
        let dir = tempfile::tempdir().unwrap();
        let env: Vec<(&str, String)> = if meet == "driver" { vec![("NESTOR_NODE_VIEW", "unshared".into())] } else { vec![] };
        let out =
            passed(torch_python(dir.path(), "tests/py/backend.py", &[dir.path().to_str().unwrap(), &workers.to_string(), "torch"], &env));
        let total = (workers * (workers + 1) / 2) as f64;
        assert_eq!(line(&out, "SUM").parse::<f64>().unwrap(), total, "{out}");
        let lines = rank_lines(&dir.path().join(format!("runs/torch-{workers}")), workers as u32);
        for (r, rank) in lines.iter().enumerate() {
            assert_eq!(rank[0]["rank"], r as u64);
            assert_eq!(rank[0]["world"], workers, "rank {r}");
            assert_eq!(rank[0]["sum"].as_f64().unwrap(), total, "rank {r}");
            assert_eq!(rank[0]["meet"], meet, "rank {r}");
        }
    }
}
