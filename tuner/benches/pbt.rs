//! Population-based training (PBT and PB2, each asynchronous and
//! synchronous) against random search (FIFO) on a problem whose best
//! learning rate changes during training (`support/drifting.rs`): noisy SGD
//! on an ill-conditioned quadratic, where a decaying rate wins.
//!
//! Every sweep has the same budget: `--trials` trials of `--iterations`
//! iterations, 4 at a time. The table gives, as medians over `--seeds`
//! seeds, the best final loss and the iterations actually run (an exploited
//! trial continues from its donor's iteration, so PBT's count differs a
//! little), and how far apart the best losses of `--repeats` runs of the
//! same seed are: asynchronous PBT's choices follow the machine's load,
//! synchronous PBT's do not.
//!
//! `cargo bench -p nestor-tuner --bench pbt [-- --seeds 10 --trials 16 --iterations 200 --repeats 3]`

#[path = "support/drifting.rs"]
mod drifting;
mod support;
use drifting::sweep;
use support::arg;

use schedulers::{Pb2Config, PbtConfig, SchedulerConfig};
use tuner::Domain;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    (v[(v.len() - 1) / 2] + v[v.len() / 2]) / 2.0
}

fn main() {
    let (seeds, trials, iterations) = (arg("--seeds", 10), arg("--trials", 16), arg("--iterations", 200));
    let repeats = arg("--repeats", 3).max(1);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let pbt = SchedulerConfig::Pbt(
        PbtConfig {
            time_attr: "training_iteration".into(),
            perturbation_interval: 10.0,
            quantile_fraction: 0.25,
            resample_probability: 0.25,
            ..Default::default()
        }
        .mutate("lr", Domain::loguniform(1e-3, 1.0)),
    );
    let pb2 = SchedulerConfig::Pb2(
        Pb2Config { time_attr: "training_iteration".into(), perturbation_interval: 10.0, quantile_fraction: 0.25, ..Default::default() }
            .bound("lr", Domain::loguniform(1e-3, 1.0)),
    );
    let synch = |c: &SchedulerConfig| match c.clone() {
        SchedulerConfig::Pbt(p) => SchedulerConfig::Pbt(PbtConfig { synch: true, ..p }),
        SchedulerConfig::Pb2(p) => SchedulerConfig::Pb2(Pb2Config { synch: true, ..p }),
        other => other,
    };
    let rows = [
        ("fifo (random)", SchedulerConfig::Fifo),
        ("pbt", pbt.clone()),
        ("pbt synch", synch(&pbt)),
        ("pb2", pb2.clone()),
        ("pb2 synch", synch(&pb2)),
    ];
    println!(
        "noisy SGD on a 10-D quadratic (condition 10), {trials} trials x {iterations} iterations, 4 at a time, medians over {seeds} seeds"
    );
    println!("{:<16} {:>16} {:>16} {:>22} {:>10}", "scheduler", "best final loss", "iterations run", "repeats differ by", "seconds");
    for (name, scheduler) in rows {
        let started = std::time::Instant::now();
        let (mut best, mut run, mut spread) = (Vec::new(), Vec::new(), 0.0f64);
        for seed in 0..seeds {
            let runs: Vec<(f64, u64)> = (0..repeats)
                .map(|r| sweep(dir.path(), &format!("{}-{r}", name.replace(' ', "-")), seed, trials, iterations, scheduler.clone()))
                .collect();
            let (lo, hi) = runs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), (v, _)| (a.min(*v), b.max(*v)));
            spread = spread.max(hi - lo);
            best.push(runs[0].0);
            run.push(runs[0].1 as f64);
        }
        let secs = started.elapsed().as_secs_f64() / (seeds * repeats) as f64;
        println!("{name:<16} {:>16.4} {:>16.0} {:>22.4} {secs:>10.2}", median(best), median(run), spread);
    }
}
