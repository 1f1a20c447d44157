//! The simulator at scale: `nestor simulate` of N trials (default 100,000)
//! with ASHA (max_t 9, grace 1, rf 3) on 16 slots, K configs (default
//! 10,000) with a learning curve of 9 values each in a curves file, and no
//! `[space]` (the search picks among the file's configs, each many times
//! when N > K). As the CLI does, the sweep runs without loading its result
//! grid and is summed up trial by trial from the store. Prints the time to
//! load the curves, the sweep's time, the process's peak RSS and the
//! store's size on disk.
//!
//! ```text
//! cargo bench -p nestor-tuner --bench simulate [-- --trials N --curves K --keep M --promotion]
//! ```
//!
//! `--keep M`: the store keeps the best M finished trials (`nestor simulate
//! --keep`); the others are summed up as they end.
//! `--promotion`: promotion ASHA (trials pause at each rung and resume from
//! their checkpoints when promoted).

mod support;
use support::{arg, peak_rss_mb};

use std::fmt::Write as _;
use std::time::Instant;

use tuner::simulate::summary;
use tuner::simulate::Curves;
use tuner::{ExperimentFile, Mode, ProgressMode, Trainable, Tuner};

// The allocator of the `nestor` binary, so the driver here is the one users run.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn dir_size(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the `nestor` binary does.
    tuner::return_freed_memory_at_once();
    let trials = arg("--trials", 100_000);
    let configs = arg("--curves", 10_000);
    let keep = arg("--keep", 0);
    let kind = if std::env::args().any(|a| a == "--promotion") { "promotion" } else { "stopping" };
    let dir = tempfile::tempdir()?;
    // Curves that fall at a config-dependent rate towards a config-dependent floor.
    let mut text = String::with_capacity(configs as usize * 120);
    for i in 0..configs {
        let h = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) as f64 / (1u64 << 53) as f64;
        let floor = 0.1 + 0.8 * h;
        let rate = 0.2 + 0.5 * ((i * 7919) % 1000) as f64 / 1000.0;
        let values: Vec<String> = (1..=9).map(|t| format!("{:.5}", floor + (1.0 - floor) * (-rate * t as f64).exp())).collect();
        let _ = writeln!(text, "{{\"config\": {{\"id\": {i}}}, \"metrics\": [{}]}}", values.join(", "));
    }
    let curves_path = dir.path().join("curves.jsonl");
    std::fs::write(&curves_path, text)?;
    let sweep = dir.path().join("sweep.toml");
    std::fs::write(
        &sweep,
        format!(
            "[experiment]\nname = \"sim-scale\"\nmetric = \"loss\"\nmode = \"min\"\nnum_samples = {trials}\n\
             max_concurrent_trials = 16\nseed = 0\nstorage = {:?}\n\n\
             [scheduler]\ntype = \"asha\"\nasha_type = \"{kind}\"\nmax_t = 9\ngrace_period = 1\nreduction_factor = 3\n\n\
             [checkpoint]\nfrequency = 1\n",
            dir.path().join("runs").display().to_string()
        ),
    )?;
    let started = Instant::now();
    let experiment = ExperimentFile::read(&sweep, &[])?;
    let curves = Curves::from_jsonl(&curves_path, "loss")?;
    let loaded = started.elapsed().as_secs_f64();
    let tuner =
        Tuner::from_file(experiment, sweep.display().to_string(), Some(Trainable::simulated(curves.clone()))).progress(ProgressMode::Quiet);
    let sweep_started = Instant::now();
    let exp = tuner.experiment_dir();
    let (_store, summary) = summary::run(tuner, &curves, Mode::Min, (keep > 0).then_some(keep as usize))?;
    let swept = sweep_started.elapsed().as_secs_f64();
    assert_eq!(summary.trials(), trials, "every trial ran");
    let kept = if keep > 0 { format!("; the best {keep} kept") } else { String::new() };
    println!("trials={trials}, {configs} configs (ASHA {kind}, max_t 9, grace 1, rf 3; 16 slots{kept})");
    println!("curves loaded in {loaded:.2} s; sweep (and its summary) {swept:.2} s; {} iterations", summary.iterations);
    println!(
        "peak RSS {:.1} MB (the sweep and its summary); store on disk {:.1} MB",
        peak_rss_mb(),
        dir_size(&exp.join("store")) as f64 / 1e6
    );
    Ok(())
}
