//! Search efficiency on real learning curves: compute spent as a share of
//! FIFO's, and regret, per scheduler and data set, over seeds.
//!
//! The curves are in `tests/curves/` (scikit-learn learners at growing
//! training sizes, MLPs by epoch, gradient boosting by stage; each point
//! with its cost in `samples_seen`; `tests/curves/generate.py` made them).
//! The held-out set (breast cancer sizes) chose no setting: it is printed
//! apart, after the mean over the other four.
//! Each seed draws 100 of a file's configs in a random order; every
//! scheduler gets the same configs in the same order on 4 slots, its rungs
//! in `samples_seen` with `max_t` where the curves end, exactly as
//! `nestor simulate --compare` runs them.
//!
//! ```text
//! cargo bench -p nestor-tuner --bench efficiency [-- --seeds 20]
//! ```

mod support;
use support::arg;

use std::path::Path;

use tuner::simulate::compare::{entries, run, table, Row};
use tuner::simulate::Curves;

const SETS: [&str; 4] = ["digits-sizes", "classification-sizes", "digits-mlp-epochs", "hastie-boosting-stages"];
const SCHEDULERS: &str = "asha,asha:asha_type=promotion,hyperband,asha:time_attr=training_iteration,learning_curve,\
                          asha:asha_type=promotion:reduction_factor=5:brackets=2";
/// Not used to choose any setting: reported apart.
const HELD_OUT: &str = "heldout-cancer-sizes";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seeds = arg("--seeds", 20);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/curves");
    let dir = tempfile::tempdir()?;
    let base: toml::Table = toml::from_str(
        "[experiment]\nname = \"efficiency\"\nmetric = \"error\"\nmode = \"min\"\nnum_samples = 100\n\
         max_concurrent_trials = 4\nseed = 0\n\n[scheduler]\ntype = \"fifo\"\ntime_attr = \"samples_seen\"\n\
         reduction_factor = 3\n\n[checkpoint]\nfrequency = 1\n",
    )?;
    let mut all: Vec<Vec<Row>> = Vec::new();
    for set in SETS.into_iter().chain([HELD_OUT]) {
        let started = std::time::Instant::now();
        let curves = Curves::from_jsonl(&root.join(format!("{set}.jsonl.gz")), "error")?.cost("samples_seen")?;
        let list = entries(SCHEDULERS, &base, set, &curves)?;
        let rows = run(&list, &curves, seeds, &dir.path().join(set), |_, _, _| {})?;
        println!(
            "{set} ({} configs, {seeds} seeds of 100, {:.1} s):",
            curves.configs().map_or(0, |c| c.len()),
            started.elapsed().as_secs_f64()
        );
        print!("{}", table(&rows, curves.cost_attr(), seeds));
        println!();
        if set != HELD_OUT {
            all.push(rows);
        }
    }
    println!("Mean over the {} data sets:", SETS.len());
    let w = all[0].iter().map(|r| r.label.len()).max().unwrap_or(0).max(40);
    println!("{:<w$} {:>16} {:>12} {:>12}", "scheduler", "compute vs FIFO", "regret mean", "regret max");
    for (i, row) in all[0].iter().enumerate() {
        let share = all.iter().map(|r| r[i].mean_share()).sum::<f64>() / all.len() as f64;
        let regret = all.iter().map(|r| r[i].mean_regret()).sum::<f64>() / all.len() as f64;
        let max = all.iter().map(|r| r[i].max_regret()).fold(0.0, f64::max);
        println!("{:<w$} {:>16} {:>12.4} {:>12.4}", row.label, format!("{:.1}%", 100.0 * share), regret, max);
    }
    Ok(())
}
