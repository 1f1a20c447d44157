//! Every public name of Ray 2.60's `ray.tune`, `ray.train` (its framework
//! packages too), `ray.air` and the parts of `ray.data` a training script
//! uses answers under nestor's same path: nestor's own object, or, used,
//! an error naming it. Ray's package is installed (source only) in a
//! cached environment (tests/ray-venv.sh) and walked by
//! python/checks/ray_api.py, which also checks that nestor's table of
//! Ray's names (python/nestor/_ray_api.json) is this Ray's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::python::{line, passed, repo, torch_venv};
use serde_json::Value;

/// Ray's package directory in its cached environment.
fn ray_package() -> PathBuf {
    let out = Command::new("bash").arg(repo().join("tests/ray-venv.sh")).output().expect("run tests/ray-venv.sh");
    assert!(out.status.success(), "tests/ray-venv.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let venv = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let found = Command::new(venv.join("bin/python"))
        .args(["-c", "import importlib.util; print(importlib.util.find_spec('ray').submodule_search_locations[0])"])
        .output()
        .unwrap();
    PathBuf::from(passed(found).trim())
}

#[test]
fn every_public_name_of_ray_answers_under_nestors_path_or_is_refused_naming_it() {
    let ray = ray_package();
    let out = Command::new(torch_venv().join("bin/python"))
        .arg(repo().join("python/checks/ray_api.py"))
        .arg(&ray)
        .arg("--check")
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .output()
        .unwrap();
    let stdout = passed(out);
    let got: Value = serde_json::from_str(line(&stdout, "RAY_API")).unwrap();
    let problems = got["problems"].as_array().unwrap();
    assert!(problems.is_empty(), "{} of Ray's names do not answer:\n{:#?}", problems.len(), problems);
    let names = got["names"].as_u64().unwrap();
    let implemented = got["implemented"].as_u64().unwrap();
    assert!(names > 500 && got["modules"].as_u64().unwrap() > 100, "the walk found Ray's surface: {got}");
    assert_eq!(implemented + got["refused"].as_u64().unwrap(), names);
    let refused: Vec<&str> = got["refused_names"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    // What Ray's own Train examples and user guides import: nestor's, not refused.
    for name in [
        "ray.air.config.RunConfig",
        "ray.air.config.ScalingConfig",
        "ray.air.integrations.keras.ReportCheckpointCallback",
        "ray.air.integrations.wandb.WandbLoggerCallback",
        "ray.air.integrations.wandb.setup_wandb",
        "ray.air.integrations.mlflow.MLflowLoggerCallback",
        "ray.air.integrations.mlflow.setup_mlflow",
        "ray.train.TRAIN_DATASET_KEY",
        "ray.train.SyncConfig",
        "ray.train.torch.prepare_optimizer",
        "ray.train.torch.torch_trainer.TorchTrainer",
        "ray.train.lightgbm.LightGBMTrainer",
        "ray.tune.CLIReporter",
        "ray.tune.ResumeConfig",
        "ray.tune.logger.pretty_print",
        "ray.data.DataContext",
        "ray.data.read_text",
        "ray.data.read_numpy",
        "ray.data.read_images",
        "ray.data.read_binary_files",
        "ray.data.from_arrow",
        "ray.data.range",
        "ray.data.preprocessors.StandardScaler",
        "ray.data.preprocessors.MinMaxScaler",
        "ray.data.preprocessors.OneHotEncoder",
        "ray.data.preprocessors.LabelEncoder",
        "ray.data.preprocessors.SimpleImputer",
        "ray.data.preprocessors.Concatenator",
        "ray.data.preprocessors.Chain",
        "ray.data.aggregate.Count",
        "ray.data.aggregate.Mean",
        "ray.data.context.DataContext",
        "ray.data.dataset.MaterializedDataset",
    ] {
        assert!(!refused.contains(&name), "{name} is refused; Ray's examples use it");
    }
    eprintln!("Ray {}: {names} public names, {implemented} nestor's own, {} refused by name", ray.display(), refused.len());
}

#[test]
fn a_refused_name_imports_and_says_what_nestor_does_instead_when_used() {
    let script = r#"
from nestor.train.horovod import HorovodTrainer
from nestor.tune.search.ax import AxSearch
from nestor.tune import CLIReporter
import nestor.train
CLIReporter(metric_columns=["loss"]).add_metric_column("acc")
for thing, name in ((HorovodTrainer, "ray.train.horovod.HorovodTrainer"), (AxSearch, "ray.tune.search.ax.AxSearch")):
    try:
        thing()
    except NotImplementedError as e:
        assert name in str(e), e
        print("REFUSED", e)
    else:
        raise SystemExit(f"{name} did not refuse")
try:
    nestor.train.TorchTrainr
except AttributeError as e:
    print("TYPO", e)
# What Ray's scripts reach without importing it: a framework package as an attribute of ray.train,
# ray.actor.ActorHandle in a type hint, FailureConfig's preemption budget.
from typing import List, Optional
from nestor.actor import ActorHandle
hint = Optional[List[ActorHandle]]
print("LIGHTNING", nestor.train.lightning.RayDDPStrategy.__name__)
print("BUDGET", nestor.train.FailureConfig(max_preemption_failures=-1, relax_collectives_on_preemption=True).max_infrastructure_failures)
"#;
    let out = Command::new(torch_venv().join("bin/python")).args(["-c", script]).output().unwrap();
    let stdout = passed(out);
    assert!(stdout.contains("REFUSED ray.train.horovod.HorovodTrainer is not in nestor: Horovod"), "{stdout}");
    assert!(stdout.contains("REFUSED ray.tune.search.ax.AxSearch is not in nestor: Ax is not among nestor's searchers"), "{stdout}");
    assert!(stdout.contains("TYPO module 'nestor.train' has no attribute 'TorchTrainr'"), "a name Ray lacks is a plain typo: {stdout}");
    assert!(stdout.contains("LIGHTNING RayDDPStrategy"), "{stdout}");
    assert!(stdout.contains("BUDGET -1"), "max_preemption_failures is nestor's infrastructure budget: {stdout}");
}
