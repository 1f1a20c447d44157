//! The run's plan, read by both clients: every fixture in `tests/contract/`
//! decoded by the Rust reader (`RunPlan::from_vars`) and by Python's
//! (`nestor._contract`, through `tests/contract/check.py`) to the same
//! routes, the ones the fixture expects. A route added to one reader and
//! not the other, or read differently, fails here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use serde_json::{json, Value};
use trainer::contract::{CheckpointOut, Rendezvous, ResumeFrom, RunPlan};

fn fixtures() -> Vec<(String, Value)> {
    let dir = common::python::repo().join("tests/contract");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap())
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn out_row(out: &CheckpointOut) -> Value {
    match out {
        CheckpointOut::InPlace => json!(["in_place", null]),
        CheckpointOut::Stage { dir } => json!(["stage", dir]),
        CheckpointOut::Ship => json!(["ship", null]),
        CheckpointOut::Upload { store, otherwise, .. } => {
            json!(["upload", store, out_row(otherwise)[0]])
        }
    }
}

/// What the Rust reader finds in a fixture's variables, in check.py's terms.
fn summary(env: &Value) -> Value {
    let var = |k: &str| env.get(k).and_then(Value::as_str).map(str::to_string);
    let (plan, token) = match RunPlan::from_vars(var) {
        Ok(found) => found,
        Err(e) => return json!({ "error": e }),
    };
    let routes = plan.routes_here(Path::exists);
    let meet = match &routes.meet {
        Rendezvous::File { path } => json!(["file", path]),
        Rendezvous::Driver => json!(["driver", null]),
        Rendezvous::Master => json!(["master", null]),
    };
    let back = match &routes.back {
        ResumeFrom::None => json!(["none", null]),
        ResumeFrom::Local { checkpoint } => json!(["local", checkpoint]),
        ResumeFrom::Driver => json!(["driver", null]),
        ResumeFrom::Store { uri, .. } => json!(["store", uri]),
    };
    json!({
        "version": plan.version,
        "trial_id": plan.trial.id,
        "config": plan.trial.config,
        "start_iteration": plan.trial.start_iteration,
        "world_size": plan.world.size,
        "addr": plan.channel.addr,
        "token": token,
        "meet": meet,
        "out": out_row(&routes.out),
        "back": back,
        "preemption_notice_s": plan.preemption.map(|p| p.notice_s),
    })
}

/// A fixture's expectation met: an error containing the expected words, or every field equal.
fn check(who: &str, name: &str, found: &Value, expect: &Value) {
    match expect.get("error").and_then(Value::as_str) {
        Some(words) => {
            let got = found.get("error").and_then(Value::as_str).unwrap_or_else(|| panic!("{who} read {name} without an error: {found}"));
            assert!(got.contains(words), "{who} on {name}: {got:?} does not say {words:?}");
        }
        None => assert_eq!(found, expect, "{who} on {name}"),
    }
}

#[test]
fn both_clients_read_every_fixture_to_the_routes_it_expects() {
    let fixtures = fixtures();
    assert!(fixtures.len() >= 9, "the fixtures are missing: {}", fixtures.len());
    let out = std::process::Command::new("python3")
        .arg(common::python::repo().join("tests/contract/check.py"))
        .env("PYTHONPATH", common::python::repo().join("python"))
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let python: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (name, fixture) in &fixtures {
        let expect = &fixture["expect"];
        check("Rust", name, &summary(&fixture["env"]), expect);
        check("Python", name, &python[name.as_str()], expect);
    }
}

#[test]
fn a_plan_the_engines_build_reads_back_the_same_in_both_clients() {
    // Every view's plan, as an engine renders it, read back by both readers.
    use trainer::contract::{ChannelPlan, NodeView, PlanSettings, TrialPlan, WorldPlan};
    let settings = PlanSettings {
        trial: TrialPlan {
            id: "trial_00001".into(),
            dir: "/e/trials/trial_00001".into(),
            config: json!({"x": 0.5, "nested": {"b": [1, 2]}, "text": "naïve \"quoted\"\n"}),
            start_iteration: 7,
            checkpoint_frequency: 1,
            experiment_name: "e".into(),
            storage_path: "/".into(),
        },
        world: WorldPlan { size: 4, use_gpu: true, torch_backend: "nccl".into(), collective_timeout_s: 60.5 },
        channel: ChannelPlan { addr: "https://node1:5000".into(), tls_ca: Some("-----BEGIN CERTIFICATE-----\nX\n".into()) },
        checkpoint: Some("/e/trials/trial_00001/checkpoint_000007".into()),
        store: Some("s3://b/e/trials/trial_00001".into()),
        checkpoint_uri: Some("s3://b/e/trials/trial_00001/checkpoint_000007".into()),
        uploader: None,
        rendezvous_file: Some("/e/trials/trial_00001/logs/.rendezvous-1".into()),
        datasets: Some("/e/datasets.json".into()),
        preemption: None,
    };
    let dir = tempfile::tempdir().unwrap();
    for (i, view) in [NodeView::Shared, NodeView::Unshared, NodeView::Unknown { probe: "/nonexistent/probe".into() }].iter().enumerate() {
        let plan = RunPlan::new(settings.clone(), view);
        let env: serde_json::Map<String, Value> = plan.env("tok").into_iter().map(|(k, v)| (k, Value::String(v))).collect();
        let expect = summary(&Value::Object(env.clone()));
        assert_eq!(expect["config"], settings.trial.config);
        let fixture = json!({ "about": "built", "env": env, "expect": expect });
        std::fs::write(dir.path().join(format!("built_{i}.json")), fixture.to_string()).unwrap();
    }
    // check.py reads the fixtures beside it: run a copy of it in the temporary directory.
    std::fs::copy(common::python::repo().join("tests/contract/check.py"), dir.path().join("check.py")).unwrap();
    let out = std::process::Command::new("python3")
        .arg(dir.path().join("check.py"))
        .env("PYTHONPATH", common::python::repo().join("python"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let python: Value = serde_json::from_slice(&out.stdout).unwrap();
    for i in 0..3 {
        let name = format!("built_{i}");
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join(format!("{name}.json"))).unwrap()).unwrap();
        check("Python", &name, &python[name.as_str()], &fixture["expect"]);
    }
}
