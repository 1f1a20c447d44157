//! The simulator: the real Tuner loop on replayed learning curves under a
//! virtual clock, and the schedulers measured on it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use schedulers::{AshaConfig, AshaType, HyperBandConfig, SchedulerConfig};
use tuner::simulate::benchmark::{anytime, best_within, crossing_curves, iterations_to_reach, run, run_space};
use tuner::{Algorithm, ResultGrid, TrialStatus, TuneConfig};

fn simulate(dir: &Path, name: &str, seed: u64, samples: u64, scheduler: SchedulerConfig, search: Algorithm) -> ResultGrid {
    run(dir, name, 0.5, TuneConfig { num_samples: samples, seed: Some(seed), scheduler, search, ..Default::default() }).unwrap()
}

fn asha(kind: AshaType) -> SchedulerConfig {
    SchedulerConfig::Asha(AshaConfig { asha_type: kind, max_t: 81.0, grace_period: Some(1.0), reduction_factor: 3.0, ..Default::default() })
}

fn hyperband() -> SchedulerConfig {
    SchedulerConfig::Hyperband(HyperBandConfig { max_t: 81.0, reduction_factor: 3.0, ..Default::default() })
}

/// How many trials reached each rung milestone.
fn reached(grid: &ResultGrid, milestones: &[u64]) -> Vec<usize> {
    milestones.iter().map(|&m| grid.iter().filter(|t| t.history.last().is_some_and(|r| r.training_iteration >= m)).count()).collect()
}

#[test]
fn a_thousand_trial_promotion_asha_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let grid = simulate(dir.path(), "promotion", 1, 1000, asha(AshaType::Promotion), Algorithm::Random);
    assert_eq!(grid.len(), 1000);
    assert!(grid.iter().all(|t| t.status == TrialStatus::Terminated), "paused trials are ended when the sweep is");
    // Every paused trial resumed from its checkpoint: no iteration ran twice, none was skipped.
    let store = tuner::store::Store::open_existing(&dir.path().join("promotion/store")).unwrap();
    for (id, results) in store.all_results().unwrap() {
        let its: Vec<u64> = results.iter().map(|r| r.training_iteration).collect();
        assert_eq!(its, (1..=its.len() as u64).collect::<Vec<_>>(), "{id}");
    }
    // Rungs at 1, 3, 9, 27, then max_t 81. Once no new trial comes, every
    // trial in the top third of a rung is promoted: at least floor(n/3) go on.
    let r = reached(&grid, &[1, 3, 9, 27, 81]);
    assert_eq!(r[0], 1000);
    for k in 0..4 {
        assert!(r[k + 1] >= r[k] / 3 && r[k + 1] < r[k], "rungs {r:?}");
    }
    let iterations: usize = grid.iter().map(|t| t.history.len()).sum();
    assert!(iterations < 1000 * 81 / 10, "{iterations} iterations");
}

#[test]
fn the_same_seed_makes_the_same_sweep() {
    for (scheduler, search) in [(hyperband(), Algorithm::Random), (asha(AshaType::Stopping), Algorithm::Tpe)] {
        let dir = tempfile::tempdir().unwrap();
        let runs: Vec<Vec<(String, serde_json::Value, u64, f64)>> = (0..2)
            .map(|i| {
                let grid = simulate(dir.path(), &format!("run{i}"), 5, 150, scheduler.clone(), search);
                grid.iter()
                    .flat_map(|t| t.history.iter().map(|r| (t.trial_id.clone(), t.config.clone(), r.training_iteration, r.metrics["loss"])))
                    .collect()
            })
            .collect();
        assert!(runs[0].len() > 150);
        assert_eq!(runs[0], runs[1]);
    }
}

/// On the simulated benchmark (crossing curves, a few good configs among
/// many), each scheduler reaches the final loss of random search with FIFO
/// in at most half of FIFO's iterations (medians over 3 seeds; the full
/// table comes from `cargo bench -p nestor-tuner --bench schedulers`).
#[test]
fn schedulers_reach_fifo_final_loss_in_half_the_iterations() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 32 * 81;
    let seeds = 0..3u64;
    let targets: Vec<f64> = seeds
        .clone()
        .map(|s| {
            best_within(
                &anytime(&simulate(dir.path(), &format!("fifo{s}"), s, 32, SchedulerConfig::Fifo, Algorithm::Random), "loss", 81),
                budget,
            )
        })
        .collect();
    for (name, scheduler) in
        [("asha-stopping", asha(AshaType::Stopping)), ("asha-promotion", asha(AshaType::Promotion)), ("hyperband", hyperband())]
    {
        let mut reach: Vec<u64> = seeds
            .clone()
            .map(|s| {
                let grid = simulate(dir.path(), &format!("{name}{s}"), s, 1000, scheduler.clone(), Algorithm::Random);
                iterations_to_reach(&anytime(&grid, "loss", 81), targets[s as usize]).unwrap_or(u64::MAX)
            })
            .collect();
        reach.sort();
        assert!(reach[1] <= budget / 2, "{name}: iterations to FIFO's final loss {reach:?}, budget {budget}");
    }
}

/// BOHB (HyperBand's brackets, TPE models per budget) on the benchmark's
/// continuous form: the configs it suggests move to the good region (small
/// `quality`) where random search's stay uniform, and within half of FIFO's
/// budget it has a better fully trained loss than HyperBand with random
/// search, for each of 3 seeds.
#[test]
fn bohb_learns_where_the_good_configs_are() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 32 * 81 / 2;
    let bracket = |search| {
        let scheduler = match search {
            Algorithm::Bohb => SchedulerConfig::HyperbandBohb(HyperBandConfig { max_t: 81.0, reduction_factor: 3.0, ..Default::default() }),
            _ => hyperband(),
        };
        TuneConfig { num_samples: 400, scheduler, search, ..Default::default() }
    };
    for seed in 0..3 {
        let bohb = run_space(dir.path(), &format!("bohb{seed}"), 0.0, TuneConfig { seed: Some(seed), ..bracket(Algorithm::Bohb) }).unwrap();
        let random =
            run_space(dir.path(), &format!("hb{seed}"), 0.0, TuneConfig { seed: Some(seed), ..bracket(Algorithm::Random) }).unwrap();
        assert_eq!(bohb.num_terminated(), bohb.len());
        let quality = |g: &ResultGrid, from: usize| {
            let q: Vec<f64> = g.iter().skip(from).map(|t| t.config["quality"].as_f64().unwrap()).collect();
            q.iter().sum::<f64>() / q.len() as f64
        };
        // The first bracket's configs are mostly random; later ones follow the model (a third stay random).
        let (b, r) = (quality(&bohb, 150), quality(&random, 150));
        assert!(b < r - 0.08 && r > 0.4, "seed {seed}: later configs' average quality: BOHB {b}, random search {r}");
        let (b, r) = (best_within(&anytime(&bohb, "loss", 81), budget), best_within(&anytime(&random, "loss", 81), budget));
        assert!(b < r, "seed {seed}: BOHB {b} vs HyperBand with random search {r}");
    }
}

#[test]
fn nestor_simulate_leaves_a_normal_experiment() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    for (config, curve) in crossing_curves(60, 3, 0.5) {
        let line = serde_json::json!({ "config": config, "metrics": curve.metrics, "seconds_per_iteration": curve.seconds_per_iteration });
        lines.push_str(&format!("{line}\n"));
    }
    std::fs::write(dir.path().join("curves.jsonl"), lines).unwrap();
    let sweep = "[experiment]\nname = \"sim\"\nmetric = \"loss\"\nmode = \"min\"\nnum_samples = 200\nseed = 9\n\
                 [checkpoint]\nfrequency = 1\n[scheduler]\ntype = \"hyperband\"\nmax_t = 81\n";
    std::fs::write(dir.path().join("sweep.toml"), sweep).unwrap();
    let nestor = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_nestor")).args(args).current_dir(dir.path()).output().unwrap();
        assert!(out.status.success(), "nestor {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let summary = nestor(&["simulate", "sweep.toml", "--curves", "curves.jsonl", "--workers", "4", "--storage", "runs"]);
    assert!(summary.contains("200 trials (200 TERMINATED)"), "{summary}");
    assert!(summary.contains("Simulated 200 trials"), "{summary}");
    let best: serde_json::Value = serde_json::from_str(&nestor(&["best", "runs/sim", "--json"])).unwrap();
    // The best trial's config is one of the file's lines, and its loss that line's final value.
    let table: BTreeMap<String, f64> =
        crossing_curves(60, 3, 0.5).into_iter().map(|(c, curve)| (c.to_string(), *curve.metrics.last().unwrap())).collect();
    let final_loss = table.get(&best["config"].to_string()).copied().unwrap();
    assert_eq!(best["metrics"]["training_iteration"], 81.0);
    assert!((best["metrics"]["loss"].as_f64().unwrap() - final_loss).abs() < 1e-12);
    // The summary, read a trial at a time, names the same best trial as the whole grid does.
    let id = best["trial_id"].as_str().unwrap_or("?");
    assert!(summary.contains(&format!("Best trial {id}: loss=")), "{summary}");
    let status = nestor(&["status", "runs/sim"]);
    assert!(status.contains("200 TERMINATED"), "{status}");
    let csv = nestor(&["export", "runs/sim", "--format", "csv"]);
    assert!(csv.lines().count() > 200);
    // A curves file with a bad line is one clear error, naming the line.
    std::fs::write(dir.path().join("bad.jsonl"), "{\"config\": {\"a\": 1}, \"metrics\": [1]}\n{\"config\": {}, \"metrics\": \"x\"}\n")
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nestor"))
        .args(["simulate", "sweep.toml", "--curves", "bad.jsonl", "--storage", "runs2"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "error: bad.jsonl: line 2: `metrics` must be an array of numbers");
    assert!(!dir.path().join("runs2").exists());
}

/// `dir/curves.jsonl`: `n` crossing curves (seed `seed`), each point 50
/// more `samples_seen` than the one before.
fn write_curves_with_cost(dir: &Path, n: usize, seed: u64) {
    let mut lines = String::new();
    for (config, curve) in crossing_curves(n, seed, 0.5) {
        let seen: Vec<f64> = (1..=curve.metrics.len()).map(|i| 50.0 * i as f64).collect();
        lines.push_str(&format!("{}\n", serde_json::json!({ "config": config, "metrics": curve.metrics, "samples_seen": seen })));
    }
    std::fs::write(dir.join("curves.jsonl"), lines).unwrap();
}

/// Rungs in a cost column with `max_t` left at its default: the curves go
/// on far past it, and `nestor simulate` says so, naming where they end.
#[test]
fn nestor_simulate_notes_a_default_max_t_below_the_curves_end() {
    let dir = tempfile::tempdir().unwrap();
    write_curves_with_cost(dir.path(), 20, 2);
    let sweep = "[experiment]\nname = \"sim\"\nmetric = \"loss\"\nmode = \"min\"\nnum_samples = 20\nseed = 2\n\
                 [scheduler]\ntype = \"asha\"\ntime_attr = \"samples_seen\"\n";
    std::fs::write(dir.path().join("sweep.toml"), sweep).unwrap();
    let run = |file: &str, storage: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_nestor"))
            .args(["simulate", file, "--curves", "curves.jsonl", "--storage", storage])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let end = 50.0 * crossing_curves(20, 2, 0.5)[0].1.metrics.len() as f64;
    let stderr = run("sweep.toml", "runs");
    assert!(
        stderr.contains(&format!("scheduler.max_t is not set, so it is 100 samples_seen (the default), while the curves end at {end}")),
        "{stderr}"
    );
    std::fs::write(dir.path().join("set.toml"), format!("{sweep}max_t = {end}\n")).unwrap();
    assert!(!run("set.toml", "runs2").contains("max_t"), "no note once max_t is set");
}

/// A simulation's time budget is virtual: the sweep stops at the budget on
/// its own clock, the same way every time, however fast the machine.
#[test]
fn a_simulations_time_budget_is_virtual_time() {
    let dir = tempfile::tempdir().unwrap();
    let budgeted = |name: &str| {
        let tune = TuneConfig {
            num_samples: 1000,
            seed: Some(2),
            time_budget_s: Some(120.0),
            scheduler: asha(AshaType::Stopping),
            ..Default::default()
        };
        run(dir.path(), name, 0.5, tune).unwrap()
    };
    let grid = budgeted("budget");
    assert!(grid.len() < 1000 && grid.len() > 8, "{} trials", grid.len());
    let stamps: Vec<f64> = grid.iter().flat_map(|t| t.history.iter().map(|r| r.metrics["timestamp"])).collect();
    let span = stamps.iter().copied().fold(f64::MIN, f64::max) - stamps.iter().copied().fold(f64::MAX, f64::min);
    // Iterations take 1 to 3 virtual seconds: the last results come within one of the budget.
    assert!(span <= 120.0 + 3.0 && span > 100.0, "virtual span {span} s");
    let again = budgeted("budget-again");
    let count = |g: &ResultGrid| g.iter().map(|t| t.history.len()).sum::<usize>();
    assert_eq!((again.len(), count(&again)), (grid.len(), count(&grid)));
}

/// A concurrency limiter on the search counts paused trials out: with a
/// pausing scheduler, the sweep runs every trial instead of stalling once
/// the limit's worth of trials are paused.
#[test]
fn a_search_limiter_does_not_stall_a_pausing_scheduler() {
    let dir = tempfile::tempdir().unwrap();
    for (name, scheduler) in [("limited-promotion", asha(AshaType::Promotion)), ("limited-hyperband", hyperband())] {
        let tune = TuneConfig { num_samples: 60, seed: Some(4), max_concurrent_search: Some(3), scheduler, ..Default::default() };
        let grid = run(dir.path(), name, 0.5, tune).unwrap();
        assert_eq!(grid.len(), 60, "{name}");
        assert!(grid.iter().all(|t| t.status == TrialStatus::Terminated), "{name}");
    }
}

/// `nestor simulate --keep N`: the store keeps the best N finished trials
/// and the summary, summed up as the others were let go of, is the one the
/// whole store gives. Such a sweep is refused a resume; a real sweep is
/// refused `keep_best`.
#[test]
fn nestor_simulate_keep_sums_up_the_same_sweep_from_a_store_of_the_best() {
    let dir = tempfile::tempdir().unwrap();
    write_curves_with_cost(dir.path(), 60, 5);
    let sweep = "[experiment]\nname = \"sim\"\nmetric = \"loss\"\nmode = \"min\"\nnum_samples = 300\nseed = 4\n\
                 [scheduler]\ntype = \"asha\"\nmax_t = 27\ngrace_period = 1\n";
    std::fs::write(dir.path().join("sweep.toml"), sweep).unwrap();
    let nestor = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_nestor")).args(args).current_dir(dir.path()).output().unwrap();
    let summary = |args: &[&str]| {
        let out = nestor(args);
        assert!(out.status.success(), "nestor {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        // Less the experiment's path and the time taken.
        let lines: Vec<String> = text.lines().skip(1).map(|l| l.split(" in ").next().unwrap_or(l).to_string()).collect();
        (text, lines)
    };
    let (_, all) = summary(&["simulate", "sweep.toml", "--curves", "curves.jsonl", "--storage", "all"]);
    let (text, kept) = summary(&["simulate", "sweep.toml", "--curves", "curves.jsonl", "--storage", "kept", "--keep", "10"]);
    assert!(text.contains("300 trials (300 TERMINATED)"), "{text}");
    assert!(text.contains("The store keeps the best 10 of the 300 finished trials (--keep)"), "{text}");
    assert!(all.iter().any(|l| l.starts_with("Compute: ")), "{all:?}");
    let kept: Vec<String> = kept.into_iter().filter(|l| !l.starts_with("The store keeps")).collect();
    assert_eq!(kept, all, "the same summary");
    // The store holds the 10 best trials by their last loss (of equals, the earlier), with their results.
    let whole = ResultGrid::load(&dir.path().join("all/sim")).unwrap();
    let mut ranked: Vec<(f64, usize, String)> =
        whole.iter().enumerate().map(|(i, t)| (t.metrics.as_ref().unwrap()["loss"], i, t.trial_id.clone())).collect();
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let best10: Vec<String> = ranked.iter().take(10).map(|r| r.2.clone()).collect();
    let store = ResultGrid::load(&dir.path().join("kept/sim")).unwrap();
    let mut ids: Vec<String> = store.iter().map(|t| t.trial_id.clone()).collect();
    ids.sort();
    let mut expected = best10.clone();
    expected.sort();
    assert_eq!(ids, expected);
    for t in store.iter() {
        let same = whole.iter().find(|w| w.trial_id == t.trial_id).unwrap();
        assert_eq!(t.history.len(), same.history.len(), "{}: all its results", t.trial_id);
    }
    let curves = tuner::simulate::Curves::from_jsonl(&dir.path().join("curves.jsonl"), "loss").unwrap();
    let resumed = tuner::Tuner::restore(dir.path().join("kept/sim"), Some(tuner::Trainable::simulated(curves))).unwrap();
    let err = resumed.progress(tuner::ProgressMode::Quiet).run().unwrap_err().to_string();
    assert!(err.contains("let go of 290") && err.contains("cannot be resumed"), "{err}");
    let grid = ResultGrid::load(&dir.path().join("kept/sim")).unwrap();
    assert_eq!((grid.len(), grid.let_go), (10, 290), "the store as it was");
    let status = nestor(&["status", "kept/sim"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains("10 trials (10 TERMINATED)\n  and 290 finished trials the simulation summed up and let go of (--keep)"),
        "{status}"
    );
    // A real sweep's trials have files and checkpoints: keep_best is refused before anything is written.
    let space = search::Space::builder().param("x", search::Domain::uniform(0.0, 1.0)).build().unwrap();
    let real = tuner::Tuner::new(tuner::Trainable::function(|_| Ok(())), space)
        .tune_config(TuneConfig { metric: Some("loss".into()), mode: Some(tuner::Mode::Min), num_samples: 2, ..Default::default() })
        .run_config(tuner::RunConfig { name: "real".into(), storage: dir.path().join("real"), ..Default::default() })
        .keep_best(1, |_| {});
    let err = real.run().unwrap_err().to_string();
    assert!(err.contains("keep_best") && err.contains("simulations only"), "{err}");
    assert!(!dir.path().join("real").exists());
}
