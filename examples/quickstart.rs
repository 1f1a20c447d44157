//! The quickstart: tune a small neural network on the red-wine quality data
//! set, 32 trials, each a 2-worker data-parallel run of in-process Rust
//! workers (gradients averaged with `all_reduce`), and print the best config,
//! its validation RMSE and its checkpoint.
//!
//! ```text
//! cargo run --release --example quickstart [-- --trials N --epochs E --workers W --storage DIR]
//! ```

use std::sync::Arc;

use anyhow::Result;
use nestor_examples::{space, train, WineData};
use tuner::{Mode, RunConfig, ScalingConfig, Scope, Stop, Trainable, TuneConfig, Tuner};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<()> {
    let trials: u64 = arg("--trials").map_or(Ok(32), |s| s.parse())?;
    let epochs: u64 = arg("--epochs").map_or(Ok(40), |s| s.parse())?;
    let workers: u32 = arg("--workers").map_or(Ok(2), |s| s.parse())?;
    let storage = arg("--storage").unwrap_or_else(|| "nestor-runs".into());
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let name = arg("--name").unwrap_or_else(|| format!("wine-quickstart-{stamp}"));

    let data = Arc::new(WineData::load()?);
    println!(
        "Tuning an MLP on red-wine quality: {} training samples, {trials} trials x {epochs} epochs, {workers} data-parallel workers per trial",
        data.n_train()
    );
    let trainable = Trainable::function(move |ctx| train(ctx, &data)).scaling(ScalingConfig::workers(workers));
    let grid = Tuner::new(trainable, space(epochs))
        .tune_config(TuneConfig {
            metric: Some("val_rmse".into()),
            mode: Some(Mode::Min),
            num_samples: trials,
            seed: Some(42),
            ..Default::default()
        })
        .run_config(RunConfig { name, storage: storage.into(), stop: Stop::new().iterations(epochs), ..Default::default() })
        .fit()?;

    let best = grid.best_result(None, None, Scope::Last)?;
    let val = best.metrics.as_ref().and_then(|m| m.get("val_rmse")).copied().unwrap_or(f64::NAN);
    println!("{} trials: {} terminated, {} errors", grid.len(), grid.num_terminated(), grid.num_errors());
    println!("Best trial: {}", best.trial_id);
    println!("  config:     {}", best.config);
    println!("  val_rmse:   {val:.4}");
    let ckpt = best.best_checkpoint("val_rmse", Mode::Min).map(|c| c.uri.as_str());
    println!("  checkpoint: {}", ckpt.unwrap_or("none"));
    println!("  results:    {}", grid.experiment_dir.display());
    Ok(())
}
