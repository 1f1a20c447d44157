//! Search efficiency: rungs in a cost attribute, compute counted in it,
//! `nestor simulate --compare`, and the learning-curve scheduler on the
//! real curves in `tests/curves/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use search::Mode;
use tuner::simulate::compare::{entries, run, score};
use tuner::simulate::{Curve, Curves};
use tuner::{ExperimentFile, ProgressMode, Trainable, Tuner};

fn curves_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/curves")
}

/// 40 configs, 12 points each; the cost of point `i` grows as 2^i (a refit
/// on twice the data), so rungs in `samples_seen` sit at other iterations
/// than rungs in iterations would.
fn table() -> Vec<(serde_json::Value, Curve)> {
    (0..40)
        .map(|i| {
            let floor = 0.05 + 0.9 * ((i * 37) % 40) as f64 / 40.0;
            let metrics: Vec<f64> = (1..=12).map(|t| floor + 0.5 * (t as f64).powf(-0.7)).collect();
            let seen: Vec<f64> = (1..=12).map(|t| (2f64.powi(t + 1) - 2.0) * 10.0).collect();
            (serde_json::json!({ "arm": i }), Curve::new(metrics, 1.0).attr("samples_seen", seen))
        })
        .collect()
}

fn sweep_file(scheduler: &str) -> ExperimentFile {
    let text = format!(
        "[experiment]\nname = \"s\"\nmetric = \"loss\"\nmode = \"min\"\nnum_samples = 40\nmax_concurrent_trials = 4\nseed = 3\n\
         [checkpoint]\nfrequency = 1\n[scheduler]\n{scheduler}\n"
    );
    ExperimentFile::from_toml(&text, "sweep.toml", &[]).unwrap()
}

#[test]
fn rungs_lie_in_the_named_attribute_and_compute_is_counted_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let end = (2f64.powi(13) - 2.0) * 10.0;
    let curves = Curves::from_table("loss", table()).cost("samples_seen").unwrap();
    assert_eq!(curves.end("samples_seen"), Some(end));
    // max_t = the end; no grace_period: two rungs, at max_t / 9 and max_t / 3.
    let mut file = sweep_file(&format!("type = \"asha\"\ntime_attr = \"samples_seen\"\nmax_t = {end}\nreduction_factor = 3"));
    file.experiment.storage = Some(dir.path().display().to_string());
    let grid =
        Tuner::from_file(file, "sweep.toml", Some(Trainable::simulated(curves.clone()))).progress(ProgressMode::Quiet).fit().unwrap();
    let rungs = [end / 9.0, end / 3.0];
    let mut stopped_at = Vec::new();
    let mut spent = 0.0;
    for t in grid.iter() {
        let last = t.history.last().unwrap();
        let seen = last.metrics["samples_seen"];
        spent += seen;
        if (last.training_iteration as usize) < 12 {
            // A stopped trial stopped at the first point at or past a rung.
            let before = t.history.iter().rev().nth(1).map_or(0.0, |r| r.metrics["samples_seen"]);
            assert!(rungs.iter().any(|&m| seen >= m && before < m), "{} stopped at samples_seen {seen}", t.trial_id);
            stopped_at.push(last.training_iteration);
        }
    }
    assert!(!stopped_at.is_empty(), "ASHA stopped nobody");
    // The rungs (9,100 and 27,300) fall at iterations 9 and 11 (samples_seen 10,220 and 40,940): where the cost is.
    assert!(stopped_at.iter().all(|&i| i == 9 || i == 11), "{stopped_at:?}");
    // What the simulator charged is what the trials' last points say they cost (nothing was paused).
    assert!((curves.spent() - spent).abs() < 1e-6, "{} != {spent}", curves.spent());
}

#[test]
fn a_curves_column_must_fit_its_curve() {
    let bad = |text: &str| Curves::parse_jsonl(text, "c.jsonl", "loss").unwrap_err().to_string();
    let ok = "{\"config\": {\"a\": 1}, \"metrics\": [3, 2, 1], \"samples_seen\": [10, 20, 40], \"seconds\": [1, 2, 4]}\n";
    let curves = Curves::parse_jsonl(ok, "c.jsonl", "loss").unwrap();
    assert_eq!(curves.attrs(), vec!["samples_seen".to_string()]);
    assert_eq!(
        bad("{\"config\": {}, \"metrics\": [3, 2, 1], \"samples_seen\": [10, 20]}"),
        "c.jsonl: line 1: `samples_seen` has 2 values for 3 points of `metrics`"
    );
    assert_eq!(
        bad("{\"config\": {}, \"metrics\": [1], \"loss\": [1]}"),
        "c.jsonl: line 1: `loss` cannot be a column: every result carries it already"
    );
    assert!(bad("{\"config\": {}, \"metrics\": [1], \"seconds\": [-1]}").contains("`seconds` must be 0 or more"));
    let shrinking = Curves::parse_jsonl("{\"config\": {}, \"metrics\": [1, 2], \"flops\": [5, 4]}", "c.jsonl", "loss").unwrap();
    let err = shrinking.cost("flops").unwrap_err().to_string();
    assert!(err.starts_with("c.jsonl: `flops` of config {} is not a cumulative cost"), "{err}");
    let err = curves.cost("flops").unwrap_err().to_string();
    assert!(err.contains("has no `flops` (the cost attribute) column"), "{err}");
}

/// The curves file `name` of tests/curves/, compute in `samples_seen`, and
/// an experiment over `samples` of its configs, 4 at a time, to compare
/// schedulers on (rungs in `samples_seen`).
fn compared(name: &str, samples: u64, seed: u64) -> (Curves, toml::Table) {
    let curves = Curves::from_jsonl(&curves_dir().join(name), "error").unwrap().cost("samples_seen").unwrap();
    let base = toml::from_str(&format!(
        "[experiment]\nname = \"e\"\nmetric = \"error\"\nmode = \"min\"\nnum_samples = {samples}\nmax_concurrent_trials = 4\nseed = {seed}\n\
         [scheduler]\ntype = \"fifo\"\ntime_attr = \"samples_seen\"\n[checkpoint]\nfrequency = 1\n"
    ))
    .unwrap();
    (curves, base)
}

#[test]
fn the_learning_curve_scheduler_saves_compute_on_real_curves_and_decides_the_same_each_time() {
    let (curves, base) = compared("digits-sizes.jsonl.gz", 60, 1);
    let list = entries("learning_curve", &base, "e", &curves).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut outcomes = Vec::new();
    let rows = run(&list, &curves, 2, &dir.path().join("a"), |label, seed, o| outcomes.push((label.to_string(), seed, o.clone()))).unwrap();
    assert_eq!(rows[0].label, "fifo");
    assert!(rows[0].shares.iter().all(|&s| s == 1.0) && rows[0].regrets.iter().all(|&r| r == 0.0));
    // It stops trials (compute well under FIFO's) and still picks a config
    // within a point of error of the best on each seed.
    let lc = &rows[1];
    assert!(lc.mean_share() < 0.7, "{:?}", lc.shares);
    assert!(lc.max_regret() <= 0.01, "{:?}", lc.regrets);
    // The same sweeps again: the same decisions, to the sample.
    let mut again = Vec::new();
    run(&list, &curves, 2, &dir.path().join("b"), |label, seed, o| again.push((label.to_string(), seed, o.clone()))).unwrap();
    assert_eq!(outcomes, again);
}

/// The target (mean regret at most 0.001 for at most a quarter of
/// FIFO's compute) on the held-out curves, which chose no setting:
/// promotion ASHA with `reduction_factor = 5` and two brackets, its rungs
/// in `samples_seen` at the default place (`max_t / 25`, `max_t / 5`, and
/// the second bracket from `max_t / 5`). The sweeps are deterministic: the
/// same 20 seeds give the same figures every run.
#[test]
fn promotion_asha_meets_the_efficiency_target_on_held_out_curves() {
    let (curves, base) = compared("heldout-cancer-sizes.jsonl.gz", 100, 0);
    let list = entries("asha:asha_type=promotion:reduction_factor=5:brackets=2", &base, "e", &curves).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rows = run(&list, &curves, 20, dir.path(), |_, _, _| {}).unwrap();
    let asha = &rows[1];
    assert!(asha.mean_share() <= 0.25, "compute {:?}", asha.shares);
    assert!(asha.mean_regret() <= 0.001, "regret {:?}", asha.regrets);
}

#[test]
fn nestor_simulate_compares_schedulers() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = "[experiment]\nname = \"cmp\"\nmetric = \"error\"\nmode = \"min\"\nnum_samples = 50\nmax_concurrent_trials = 4\nseed = 0\n\
                 [scheduler]\ntype = \"asha\"\ntime_attr = \"samples_seen\"\nreduction_factor = 3\n[checkpoint]\nfrequency = 1\n";
    std::fs::write(dir.path().join("sweep.toml"), sweep).unwrap();
    let curves = curves_dir().join("digits-sizes.jsonl.gz");
    let nestor = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_nestor")).args(args).current_dir(dir.path()).output().unwrap();
    let out = nestor(&[
        "simulate",
        "sweep.toml",
        "--curves",
        curves.to_str().unwrap(),
        "--compare",
        "asha,asha:asha_type=promotion,hyperband,learning_curve",
        "--seeds",
        "2",
        "--storage",
        "runs",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Vec<&str>> = text.lines().skip(1).take(5).map(|l| l.split_whitespace().collect()).collect();
    let labels: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(labels, ["fifo", "asha", "asha:asha_type=promotion", "hyperband", "learning_curve"]);
    assert_eq!(rows[0][1..], ["100.0%", "0.0000", "0.0000", "2"]);
    for r in &rows[1..] {
        let share: f64 = r[1].trim_end_matches('%').parse().unwrap();
        assert!(share > 0.0 && share < 100.0, "{r:?}");
        assert!(r[2].parse::<f64>().unwrap() >= 0.0);
    }
    assert!(text.contains("compute in samples_seen"), "{text}");
    // The sweeps were scratch: nothing is left behind.
    assert_eq!(std::fs::read_dir(dir.path().join("runs")).map(|d| d.count()).unwrap_or(0), 0);
    // A scheduler that cannot be built is named.
    let out = nestor(&["simulate", "sweep.toml", "--curves", curves.to_str().unwrap(), "--compare", "asha:reduction_factor=1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--compare asha:reduction_factor=1") && err.contains("scheduler.reduction_factor"), "{err}");
    // A plain simulation reports its compute and the chosen config's final value.
    let out =
        nestor(&["simulate", "sweep.toml", "--curves", curves.to_str().unwrap(), "--storage", "runs", "--set", "scheduler.max_t=4250"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("Compute: ") && text.contains(" samples_seen; the chosen config's final error is "), "{text}");
}

#[test]
fn scoring_picks_the_best_trial_trained_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let curves = Curves::from_table("loss", table()).cost("samples_seen").unwrap();
    let mut file = sweep_file("type = \"fifo\"");
    file.experiment.storage = Some(dir.path().display().to_string());
    let grid =
        Tuner::from_file(file, "sweep.toml", Some(Trainable::simulated(curves.clone()))).progress(ProgressMode::Quiet).fit().unwrap();
    let o = score(&grid, &curves, Mode::Min, None);
    let best = grid.iter().map(|t| t.history.last().unwrap().metrics["loss"]).fold(f64::INFINITY, f64::min);
    assert_eq!((o.chosen, o.best, o.regret), (best, best, 0.0));
    assert_eq!(o.spent, curves.spent());
}
