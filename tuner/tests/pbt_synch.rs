//! Synchronous PBT decides the same way whatever the machine's load: the
//! same sweep on the drifting-rate problem, run again and again (4 trials at
//! a time, 8 in the population, so trials pause and wait for each other at
//! every interval), ends with the same best loss and the same exploits.

#[path = "../benches/support/drifting.rs"]
mod drifting;

use schedulers::{PbtConfig, SchedulerConfig};
use tuner::Domain;

fn pbt(synch: bool) -> SchedulerConfig {
    SchedulerConfig::Pbt(
        PbtConfig {
            time_attr: "training_iteration".into(),
            perturbation_interval: 10.0,
            quantile_fraction: 0.25,
            resample_probability: 0.25,
            synch,
            ..Default::default()
        }
        .mutate("lr", Domain::loguniform(1e-3, 1.0)),
    )
}

/// Each exploit as (recipient, its number, donor, donor's iteration, new config).
fn exploits(dir: &std::path::Path, name: &str) -> Vec<(String, u32, String, u64, String)> {
    let store = tuner::store::Store::open_existing(&dir.join(format!("{name}/store"))).unwrap_or_else(|e| panic!("{e}"));
    let mut all: Vec<_> = store
        .exploits()
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|e| (e.trial_id, e.n, e.donor, e.donor_iteration, e.new_config.to_string()))
        .collect();
    all.sort();
    all
}

#[test]
fn eight_runs_of_a_synchronous_pbt_sweep_end_alike() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (trials, iterations, seed) = (8, 60, 3);
    let mut outcomes = Vec::new();
    for run in 0..8 {
        let name = format!("synch{run}");
        let (best, iterations_run) = drifting::sweep(dir.path(), &name, seed, trials, iterations, pbt(true));
        let exploits = exploits(dir.path(), &format!("{name}-{seed}"));
        outcomes.push((best, iterations_run, exploits));
    }
    let (best, run, first) = &outcomes[0];
    assert!(!first.is_empty(), "the population exploited nothing: the test shows nothing");
    assert_eq!(*run, trials * iterations, "every trial ran every iteration once (exploits start at the same iteration)");
    for (i, (b, r, e)) in outcomes.iter().enumerate().skip(1) {
        assert_eq!(e, first, "run {i} exploited differently from run 0");
        assert_eq!((b.to_bits(), r), (best.to_bits(), run), "run {i}: best loss {b} vs {best}");
    }
}
