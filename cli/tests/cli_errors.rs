//! Bad experiment files and flags: one clear line on stderr, a non-zero exit,
//! and nothing written.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

const GOOD: &str = r#"
[experiment]
name = "bad-input"
metric = "loss"
mode = "min"
num_samples = 2

[space]
lr = { loguniform = [1e-4, 1e-1] }
batch = { choice = [16, 32] }

[trainer]
command = ["true"]
"#;

fn nestor(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nestor")).args(args).current_dir(dir).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn check_refused(text: &str, sets: &[&str], expect: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("sweep.toml"), text).unwrap();
    let mut args = vec!["run", "sweep.toml", "--storage", "runs"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let (code, stdout, stderr) = nestor(dir.path(), &args);
    assert_eq!(code, 2, "stderr: {stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr}");
    assert!(stderr.contains(expect), "expected {expect:?} in {stderr:?}");
    assert!(!dir.path().join("runs").exists(), "a refused experiment must leave nothing behind");
}

#[test]
fn unknown_key_is_named_with_its_line() {
    check_refused(&GOOD.replace("num_samples = 2", "num_sample = 2"), &[], "sweep.toml: line 6, column 1: unknown field `num_sample`");
}

#[test]
fn wrong_type_is_named() {
    check_refused(
        &GOOD.replace("num_samples = 2", "num_samples = \"two\""),
        &[],
        "line 6, column 15: invalid type: string \"two\", expected u64",
    );
}

#[test]
fn impossible_domain_is_named() {
    check_refused(&GOOD.replace("1e-4, 1e-1", "0.5, 0.1"), &[], "sweep.toml: space.lr: loguniform low 0.5 > high 0.1");
    check_refused(&GOOD.replace("1e-4, 1e-1", "0.0, 0.1"), &[], "space.lr: loguniform low must be > 0, got 0");
}

#[test]
fn empty_choice_is_named() {
    check_refused(&GOOD.replace("[16, 32]", "[]"), &[], "sweep.toml: space.batch: choice needs at least one value");
}

#[test]
fn unknown_section_is_named() {
    check_refused(&format!("{GOOD}\n[schedular]\ntype = \"fifo\"\n"), &[], "unknown field `schedular`");
}

#[test]
fn bad_overrides_are_named() {
    check_refused(GOOD, &["experiment.num_samples=lots"], "--set experiment.num_samples=lots");
    check_refused(GOOD, &["space.lr={ uniform = [2, 1] }"], "space.lr: uniform low 2.0 > high 1.0");
    check_refused(GOOD, &["oops"], "--set oops: expected key=value");
}

#[test]
fn missing_file_and_missing_experiment() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = nestor(dir.path(), &["run", "nope.toml"]);
    assert_eq!(code, 2);
    assert!(stderr.starts_with("error: cannot read nope.toml"), "{stderr}");
    for cmd in [vec!["status", "nowhere"], vec!["best", "nowhere"], vec!["export", "nowhere", "--format", "csv"], vec!["resume", "nowhere"]]
    {
        let (code, _, stderr) = nestor(dir.path(), &cmd);
        assert_eq!(code, 2, "{cmd:?}: {stderr}");
        assert!(stderr.contains("no nestor experiment at nowhere"), "{cmd:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1);
    }
    let (code, _, stderr) = nestor(dir.path(), &["best", ".", "--scope", "best"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("scope must be last, avg, all or last-N-avg"), "{stderr}");
}

#[test]
fn sample_shows_seeded_configs_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("sweep.toml"), GOOD.replace("num_samples = 2", "num_samples = 2\nseed = 5")).unwrap();
    let (code, a, _) = nestor(dir.path(), &["sample", "sweep.toml", "-n", "3"]);
    assert_eq!(code, 0);
    let (_, b, _) = nestor(dir.path(), &["sample", "sweep.toml", "-n", "3"]);
    assert_eq!(a, b, "same seed, same configs");
    let configs: Vec<serde_json::Value> = a.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(configs.len(), 2, "num_samples = 2 caps the sample");
    for c in &configs {
        let lr = c["lr"].as_f64().unwrap();
        assert!((1e-4..=1e-1).contains(&lr));
        assert!([16, 32].contains(&c["batch"].as_i64().unwrap()));
    }
    let (_, other, _) = nestor(dir.path(), &["sample", "sweep.toml", "-n", "3", "--set", "experiment.seed=6"]);
    assert_ne!(other, a);
    assert!(!dir.path().join("nestor-runs").exists());
}

#[test]
fn a_worker_program_that_does_not_exist_is_refused_before_any_trial() {
    check_refused(
        &GOOD.replace("command = [\"true\"]", "command = [\"./no-such-worker\", \"--x\"]"),
        &[],
        "trainer.command: program \"./no-such-worker\" not found",
    );
    check_refused(
        &GOOD.replace("command = [\"true\"]", "command = [\"no-such-worker-on-path\"]"),
        &[],
        "program \"no-such-worker-on-path\" not found",
    );
    check_refused(&GOOD.replace("command = [\"true\"]", "command = []"), &[], "trainer.command: must name a program");
}

#[test]
fn invalid_checkpoint_and_failure_sections_are_named() {
    let with = |section: &str| format!("{GOOD}\n{section}\n");
    check_refused(&with("[checkpoint]\nnum_to_keep = 0"), &[], "sweep.toml: checkpoint.num_to_keep: must be at least 1");
    check_refused(&with("[checkpoint]\nnum_to_keep = -1"), &[], "invalid value: integer `-1`, expected usize");
    check_refused(&with("[checkpoint]\nscore_order = \"up\""), &[], "unknown variant `up`, expected `min` or `max`");
    check_refused(&with("[checkpoint]\nkeep = 2"), &[], "unknown field `keep`");
    check_refused(&with("[checkpoint]\nscore_attribute = \"\""), &[], "checkpoint.score_attribute: must name a metric");
    check_refused(
        &with("[checkpoint]\nallowed_dirs = [\"/no/such/dir\"]"),
        &[],
        "checkpoint.allowed_dirs[0]: /no/such/dir is not a directory",
    );
    check_refused(&with("[failure]\nmax_failures = -2"), &[], "failure.max_failures: must be -1 (no limit) or more, got -2");
    check_refused(&with("[failure]\nhang_timeout_s = 0"), &[], "failure.hang_timeout_s: must be a positive number of seconds, got 0");
    check_refused(GOOD, &["failure.retries=3"], "unknown field `retries`");
}

#[test]
fn impossible_schedulers_are_refused_naming_the_key() {
    let with = |section: &str| format!("{GOOD}\n[scheduler]\n{section}\n");
    check_refused(
        &with("type = \"asha\"\nreduction_factor = 1"),
        &[],
        "sweep.toml: scheduler.reduction_factor: must be greater than 1, got 1",
    );
    check_refused(&with("type = \"hyperband\"\nreduction_factor = 0.5"), &[], "scheduler.reduction_factor: must be greater than 1");
    check_refused(&with("type = \"asha\"\nmax_t = 10\ngrace_period = 20"), &[], "scheduler.grace_period: 20 is greater than max_t = 10");
    check_refused(&with("type = \"asha\"\ngrace = 2"), &[], "unknown field `grace`");
    check_refused(&with("type = \"asha\"\nasha_type = \"eager\""), &[], "unknown variant `eager`");
    check_refused(&with("type = \"pbx\""), &[], "unknown variant `pbx`");
    // PBT: checkpoints needed, its fractions in range, its mutations inside [space].
    let pbt = |extra: &str, mutations: &str| {
        format!(
            "{GOOD}\n[checkpoint]\nfrequency = 1\n\n[scheduler]\ntype = \"pbt\"\n{extra}\n[scheduler.hyperparam_mutations]\n{mutations}\n"
        )
    };
    check_refused(
        &format!("{GOOD}\n[scheduler]\ntype = \"pbt\"\n[scheduler.hyperparam_mutations]\nlr = {{ loguniform = [1e-3, 1e-2] }}\n"),
        &[],
        "sweep.toml: scheduler.type: pbt restarts trials from the checkpoints of better ones: set checkpoint.frequency",
    );
    check_refused(&pbt("quantile_fraction = 0.7", "batch = [16, 32]"), &[], "scheduler.quantile_fraction: must be in (0, 0.5], got 0.7");
    check_refused(&pbt("", ""), &[], "scheduler.hyperparam_mutations: required");
    check_refused(
        &pbt("", "lr = { loguniform = [1e-5, 1e-1] }"),
        &[],
        "sweep.toml: scheduler.hyperparam_mutations.lr: loguniform [0.00001, 0.1] is outside [space] lr = loguniform [0.0001, 0.1]",
    );
    check_refused(&pbt("", "batch = [16, 64]"), &[], "scheduler.hyperparam_mutations.batch: the value 64 is outside [space] batch");
    check_refused(
        &pbt("", "momentum = [0.9, 0.99]"),
        &[],
        "scheduler.hyperparam_mutations.momentum: `momentum` is not a parameter of [space]",
    );
    // PB2: the same, with bounds.
    let pb2 = |bounds: &str| {
        format!("{GOOD}\n[checkpoint]\nfrequency = 1\n\n[scheduler]\ntype = \"pb2\"\n[scheduler.hyperparam_bounds]\n{bounds}\n")
    };
    check_refused(
        &format!("{GOOD}\n[scheduler]\ntype = \"pb2\"\n[scheduler.hyperparam_bounds]\nlr = [1e-3, 1e-2]\n"),
        &[],
        "sweep.toml: scheduler.type: pb2 restarts trials from the checkpoints of better ones: set checkpoint.frequency",
    );
    check_refused(&pb2(""), &[], "scheduler.hyperparam_bounds: required");
    check_refused(&pb2("lr = [0.0, 0.5]"), &[], "scheduler.hyperparam_bounds.lr: uniform [0, 0.5) is outside [space] lr");
    check_refused(&pb2("batch = { choice = [16, 32] }"), &[], "scheduler.hyperparam_bounds.batch: PB2 explores bounded numbers");
    check_refused(&pb2("lr = [0.1, 0.01]"), &[], "scheduler.hyperparam_bounds.lr: expected [low, high] with low < high");
    check_refused(&with("type = \"median_stopping\"\nmin_samples_required = 0"), &[], "scheduler.min_samples_required: must be at least 1");
    // Resource changing: checkpoints needed; its base checked as a scheduler of its own.
    check_refused(
        &with("type = \"resource_changing\""),
        &[],
        "scheduler.type: resource_changing restarts trials from their checkpoints with another number of workers: set checkpoint.frequency",
    );
    check_refused(
        &format!("{GOOD}\n[checkpoint]\nfrequency = 1\n\n[scheduler]\ntype = \"resource_changing\"\n\n[scheduler.base]\ntype = \"asha\"\nmax_t = 0\n"),
        &[],
        "sweep.toml: scheduler.base.max_t: must be a positive number, got 0",
    );
    check_refused(
        &format!("{GOOD}\n[checkpoint]\nfrequency = 1\n\n[scheduler]\ntype = \"resource_changing\"\nallocation = \"everyone\"\n"),
        &[],
        "unknown variant `everyone`, expected `distribute` or `top_job`",
    );
    // No mode: neither the scheduler's nor the experiment's.
    let no_mode = GOOD.replace("metric = \"loss\"\nmode = \"min\"\n", "") + "\n[scheduler]\ntype = \"asha\"\nmetric = \"loss\"\n";
    check_refused(&no_mode, &[], "sweep.toml: scheduler.mode: required");
    // Pausing schedulers resume trials from checkpoints: the experiment must say trials make them.
    check_refused(
        &with("type = \"asha\"\nasha_type = \"promotion\""),
        &[],
        "scheduler.asha_type: asha_type = \"promotion\" pauses trials and resumes them from their checkpoints: set checkpoint.frequency",
    );
    check_refused(&with("type = \"hyperband\""), &[], "scheduler.type: hyperband pauses trials");
    check_refused(
        &with("type = \"median_stopping\"\nhard_stop = false"),
        &[],
        "scheduler.hard_stop: median_stopping with hard_stop = false pauses trials",
    );
    check_refused(&with("type = \"asha\""), &["scheduler.max_t=0"], "scheduler.max_t: must be a positive number, got 0");
    check_refused(&format!("{GOOD}\n[checkpoint]\nfrequency = 0\n"), &[], "checkpoint.frequency: must be at least 1");
}

#[test]
fn tpe_settings_are_checked() {
    check_refused(&format!("{GOOD}\n[search]\nmultivariate = true\n"), &[], "search.multivariate: is a TPE setting");
    let no_metric = GOOD.replace("metric = \"loss\"\nmode = \"min\"\n", "") + "\n[search]\nalgorithm = \"tpe\"\n";
    check_refused(&no_metric, &[], "experiment.metric: required by search.algorithm = \"tpe\"");
    check_refused(
        &format!("{GOOD}\n[search]\nalgorithm = \"tpe\"\nn_ei_candidates = 0\n"),
        &[],
        "search.n_ei_candidates: must be at least 1",
    );
}

#[test]
fn bohb_settings_are_checked() {
    let bohb = |search: &str, scheduler: &str| {
        format!("{GOOD}\n[checkpoint]\nfrequency = 1\n\n[search]\nalgorithm = \"bohb\"\n{search}\n[scheduler]\n{scheduler}\n")
    };
    check_refused(
        &bohb("", "type = \"asha\""),
        &[],
        "sweep.toml: search.algorithm: bohb learns from the budgets of HyperBand's brackets: set scheduler.type = \"hyperband_bohb\" (not \"asha\")",
    );
    check_refused(&bohb("random_fraction = 2.0", "type = \"hyperband_bohb\""), &[], "search.random_fraction: must be in [0, 1], got 2");
    check_refused(&bohb("top_n_percent = 100", "type = \"hyperband_bohb\""), &[], "search.top_n_percent: must be in (0, 100)");
    check_refused(&bohb("", "type = \"hyperband_bohb\"\nreduction_factor = 1"), &[], "scheduler.reduction_factor: must be greater than 1");
    check_refused(&format!("{GOOD}\n[search]\nalgorithm = \"tpe\"\ntop_n_percent = 10\n"), &[], "search.top_n_percent: is a BOHB setting");
    let no_metric = GOOD.replace("metric = \"loss\"\nmode = \"min\"\n", "") + "\n[search]\nalgorithm = \"bohb\"\n";
    check_refused(&no_metric, &[], "experiment.metric: required by search.algorithm = \"bohb\"");
}

#[test]
fn repeat_zero_is_refused() {
    check_refused(&format!("{GOOD}\n[search]\nrepeat = 0\n"), &[], "search.repeat: must be at least 1");
}
