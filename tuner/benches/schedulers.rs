//! The schedulers on a simulated benchmark (crossing learning curves, a few
//! good configs among many), against random search with FIFO.
//!
//! FIFO runs `--fifo-trials` configs to the end (81 iterations each); its
//! best final loss is the target and its iterations the budget. Each other
//! scheduler samples from the same configs; the table gives, as medians
//! over seeds, the iterations it took to reach FIFO's final loss and the
//! best final loss it had within half of FIFO's budget.
//!
//! Two forms of the same curves: a table of 400 arms (configs with nothing
//! in common: a searcher can only pick among them) and a continuous space
//! `{ quality, speed }` that the curves are a function of, where a
//! model-based searcher (BOHB, with HyperBand's brackets) has something to
//! learn. `--space arms|continuous|both` (default both).
//!
//! `cargo bench -p nestor-tuner --bench schedulers [-- --seeds 10]`

use schedulers::{AshaConfig, AshaType, HyperBandConfig, SchedulerConfig};
use tuner::simulate::benchmark::{anytime, best_within, iterations_to_reach, run, run_space};
use tuner::{Algorithm, TuneConfig};

const MAX_T: u64 = 81;

fn sweep(
    dir: &std::path::Path,
    space: &str,
    name: &str,
    seed: u64,
    samples: u64,
    scheduler: SchedulerConfig,
    correlation: f64,
) -> Vec<(u64, f64)> {
    // BOHB is HyperBand's scheduler with its own searcher.
    let search = if matches!(scheduler, SchedulerConfig::HyperbandBohb(_)) { Algorithm::Bohb } else { Algorithm::Random };
    let tune = TuneConfig { num_samples: samples, seed: Some(seed), scheduler, search, ..Default::default() };
    let name = format!("{space}-{name}-{seed}-{correlation}");
    let grid = if space == "arms" { run(dir, &name, correlation, tune) } else { run_space(dir, &name, correlation, tune) };
    anytime(&grid.unwrap_or_else(|e| panic!("{name}: {e}")), "loss", MAX_T)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    (v[(v.len() - 1) / 2] + v[v.len() / 2]) / 2.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |k: &str, d: u64| args.iter().position(|a| a == k).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (seeds, fifo_trials) = (arg("--seeds", 10), arg("--fifo-trials", 32));
    let which = args.iter().position(|a| a == "--space").and_then(|i| args.get(i + 1)).map_or("both", String::as_str);
    let spaces: Vec<&str> = ["arms", "continuous"].into_iter().filter(|s| which == "both" || which == *s).collect();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let budget = fifo_trials * MAX_T;
    let asha = |t: AshaType| {
        SchedulerConfig::Asha(AshaConfig {
            asha_type: t,
            max_t: MAX_T as f64,
            grace_period: Some(1.0),
            reduction_factor: 3.0,
            ..Default::default()
        })
    };
    let hyperband = SchedulerConfig::Hyperband(HyperBandConfig { max_t: MAX_T as f64, reduction_factor: 3.0, ..Default::default() });
    let bohb = SchedulerConfig::HyperbandBohb(HyperBandConfig { max_t: MAX_T as f64, reduction_factor: 3.0, ..Default::default() });
    println!(
        "budget: FIFO with random search, {fifo_trials} trials x {MAX_T} iterations = {budget} iterations; medians over {seeds} seeds"
    );
    for (space, correlation) in spaces.iter().flat_map(|s| [(*s, 0.5), (*s, 0.0)]) {
        let started = std::time::Instant::now();
        let mut targets = Vec::new();
        for seed in 0..seeds {
            let curve = sweep(dir.path(), space, "fifo", seed, fifo_trials, SchedulerConfig::Fifo, correlation);
            targets.push(best_within(&curve, budget));
        }
        println!();
        println!("{space}: speed-to-quality correlation {correlation}");
        println!("{:<18} {:>24} {:>28} {:>10}", "scheduler", "best final in budget/2", "iterations to FIFO's final", "fraction");
        println!("{:<18} {:>24.4} {:>28} {:>10}", "fifo (random)", median(targets.clone()), budget, "1.00");
        for (name, sched) in [
            ("asha stopping", asha(AshaType::Stopping)),
            ("asha promotion", asha(AshaType::Promotion)),
            ("hyperband", hyperband.clone()),
            ("bohb", bohb.clone()),
        ] {
            let mut reach = Vec::new();
            let mut half = Vec::new();
            for seed in 0..seeds {
                let curve = sweep(dir.path(), space, name, seed, 1000, sched.clone(), correlation);
                reach.push(iterations_to_reach(&curve, targets[seed as usize]).map_or(f64::INFINITY, |i| i as f64));
                half.push(best_within(&curve, budget / 2));
            }
            let r = median(reach);
            println!("{:<18} {:>24.4} {:>28} {:>10.2}", name, median(half), r, r / budget as f64);
        }
        println!("({:.1} s for {} simulated sweeps)", started.elapsed().as_secs_f64(), seeds * 5);
    }
}
