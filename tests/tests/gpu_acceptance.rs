//! The GPU acceptance run (`tests/gpu/run.sh`) waits for a GPU; its script
//! runs here without one (`--cpu`: declared GPUs for the scheduling checks,
//! gloo for the collectives), so that it still works the day a GPU comes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::python::{repo, torch_venv};
use common::*;

#[test]
fn the_gpu_acceptance_script_runs_its_checks_without_a_gpu() {
    let out = Command::new(torch_venv().join("bin/python"))
        .arg(repo().join("tests/gpu/acceptance.py"))
        .arg("--cpu")
        .env("NESTOR_BIN", nestor_bin())
        .env("PATH", format!("{}:{}", torch_venv().join("bin").display(), std::env::var("PATH").unwrap_or_default()))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    for check in ["share", "turns", "ddp", "fsdp", "hf", "lightning"] {
        assert!(said.lines().any(|l| l.starts_with(&format!("PASS {check} "))), "{check} passed:\n{said}");
    }
    for needs_a_gpu in ["pool", "deepspeed"] {
        assert!(said.lines().any(|l| l.starts_with(&format!("SKIP {needs_a_gpu} "))), "{needs_a_gpu} skipped, saying why:\n{said}");
    }
}
