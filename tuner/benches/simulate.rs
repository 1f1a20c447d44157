//! The simulator at scale: `nestor simulate` of N trials (default 100,000)
//! with ASHA (max_t 9, grace 1, rf 3) on 16 slots, one learning curve of 9
//! values per config in a curves file, and no `[space]` (the search picks
//! among the file's configs). Prints the time to load the curves, the
//! sweep's time, the process's peak RSS and the store's size on disk.
//!
//! ```text
//! cargo bench -p nestor-tuner --bench simulate [-- --trials N]
//! ```

mod support;
use support::{arg, peak_rss_mb};

use std::fmt::Write as _;
use std::time::Instant;

use tuner::simulate::Curves;
use tuner::{ExperimentFile, ProgressMode, Trainable, Tuner};

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
    let dir = tempfile::tempdir()?;
    // Curves that fall at a config-dependent rate towards a config-dependent floor.
    let mut text = String::with_capacity(trials as usize * 120);
    for i in 0..trials {
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
             [scheduler]\ntype = \"asha\"\nmax_t = 9\ngrace_period = 1\nreduction_factor = 3\n",
            dir.path().join("runs").display().to_string()
        ),
    )?;
    let started = Instant::now();
    let experiment = ExperimentFile::read(&sweep, &[])?;
    let curves = Curves::from_jsonl(&curves_path, "loss")?;
    let loaded = started.elapsed().as_secs_f64();
    let tuner = Tuner::from_file(experiment, sweep.display().to_string(), Some(Trainable::simulated(curves))).progress(ProgressMode::Quiet);
    let exp = tuner.experiment_dir();
    let sweep_started = Instant::now();
    let grid = tuner.fit()?;
    let swept = sweep_started.elapsed().as_secs_f64();
    assert_eq!(grid.len() as u64, trials, "every trial ran");
    let iterations: u64 = grid.iter().map(|t| t.history.len() as u64).sum();
    println!("trials={trials} (ASHA max_t 9, grace 1, rf 3; 16 slots)");
    println!("curves loaded in {loaded:.2} s; sweep (with its result grid) {swept:.2} s; {iterations} iterations");
    println!("peak RSS {:.1} MB; store on disk {:.1} MB", peak_rss_mb(), dir_size(&exp.join("store")) as f64 / 1e6);
    Ok(())
}
