//! The quickstart: tune a small neural network on the red-wine quality data
//! set with ASHA, 64 trials, each a 2-worker data-parallel run of in-process
//! Rust workers (gradients averaged with `all_reduce`); ASHA stops the
//! unpromising ones early. Prints the best config, its validation RMSE and
//! its checkpoint.
//!
//! ```text
//! cargo run --release --example quickstart [-- --trials N --epochs E --workers W --storage DIR
//!                                              --scheduler asha|asha-promotion|hyperband|bohb|median|pbt|pb2|fifo]
//! ```
//!
//! With `--scheduler pbt`, 16 trials train together (PBT needs a population
//! running at once) and the worst quarter takes over the best trials'
//! weights every 4 epochs, exploring their learning rate and weight decay.

use std::sync::Arc;

use anyhow::{bail, Result};
use clap::Parser;
use nestor_examples::{space, train, WineData};
use tuner::{
    Algorithm, AshaConfig, AshaType, CheckpointConfig, Domain, HyperBandConfig, MedianStoppingConfig, Mode, NodeResources, Pb2Config,
    PbtConfig, RunConfig, ScalingConfig, SchedulerConfig, Scope, Stop, Trainable, TuneConfig, Tuner,
};

/// Tune an MLP on red-wine quality: each trial a data-parallel run of
/// in-process Rust workers.
#[derive(Parser, Debug)]
#[command(name = "quickstart")]
struct Args {
    /// How many configs to try [default: 64; 16 with --scheduler pbt or pb2].
    #[arg(long)]
    trials: Option<u64>,
    /// Epochs each trial trains at most.
    #[arg(long, default_value_t = 40)]
    epochs: u64,
    /// Data-parallel workers per trial.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Where experiments are written.
    #[arg(long, default_value = "nestor-runs")]
    storage: String,
    /// The experiment's name [default: wine-quickstart-<unix time>].
    #[arg(long)]
    name: Option<String>,
    /// asha, asha-promotion, hyperband, bohb, median, pbt, pb2 or fifo.
    #[arg(long, default_value = "asha")]
    scheduler: String,
}

/// The scheduler named on the command line, over `epochs` epochs: rungs
/// from a tenth of the run, keeping a third at each.
fn scheduler(name: &str, epochs: u64) -> Result<SchedulerConfig> {
    let (max_t, grace) = (epochs as f64, (epochs / 10).max(1) as f64);
    let asha = |asha_type| AshaConfig { asha_type, max_t, grace_period: Some(grace), reduction_factor: 3.0, ..Default::default() };
    Ok(match name {
        "asha" => SchedulerConfig::Asha(asha(AshaType::Stopping)),
        "asha-promotion" => SchedulerConfig::Asha(asha(AshaType::Promotion)),
        "hyperband" => {
            SchedulerConfig::Hyperband(HyperBandConfig { max_t, grace_period: Some(grace), reduction_factor: 3.0, ..Default::default() })
        }
        // BOHB: HyperBand's brackets, configs from TPE models of each budget's results.
        "bohb" => SchedulerConfig::HyperbandBohb(HyperBandConfig {
            max_t,
            grace_period: Some(grace),
            reduction_factor: 3.0,
            ..Default::default()
        }),
        "median" => SchedulerConfig::MedianStopping(MedianStoppingConfig { grace_period: grace, ..Default::default() }),
        // Every trial trains to the end; every tenth of the run the bottom quarter
        // takes over a top trial's weights and explores its learning rate and weight decay.
        "pbt" => SchedulerConfig::Pbt(
            PbtConfig {
                time_attr: "training_iteration".into(),
                perturbation_interval: grace,
                quantile_fraction: 0.25,
                ..Default::default()
            }
            .mutate("lr", Domain::loguniform(1e-4, 3e-2))
            .mutate("weight_decay", Domain::loguniform(1e-5, 1e-1)),
        ),
        // PB2: the same population, the new values chosen by a Gaussian-process bandit.
        "pb2" => SchedulerConfig::Pb2(
            Pb2Config {
                time_attr: "training_iteration".into(),
                perturbation_interval: grace,
                quantile_fraction: 0.25,
                ..Default::default()
            }
            .bound("lr", Domain::loguniform(1e-4, 3e-2))
            .bound("weight_decay", Domain::loguniform(1e-5, 1e-1)),
        ),
        "fifo" => SchedulerConfig::Fifo,
        other => bail!("--scheduler {other}: expected asha, asha-promotion, hyperband, bohb, median, pbt, pb2 or fifo"),
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (scheduler_name, epochs, workers) = (args.scheduler.as_str(), args.epochs, args.workers);
    // PBT evolves a population that trains at once: 16 trials, all running together.
    let pbt = scheduler_name == "pbt" || scheduler_name == "pb2";
    let trials = args.trials.unwrap_or(if pbt { 16 } else { 64 });
    let scheduler = scheduler(scheduler_name, epochs)?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let name = args.name.unwrap_or_else(|| format!("wine-quickstart-{stamp}"));
    let storage = args.storage;

    let data = Arc::new(WineData::load()?);
    println!(
        "Tuning an MLP on red-wine quality with {scheduler_name}: {} training samples, {trials} trials x up to {epochs} epochs, \
         {workers} data-parallel workers per trial",
        data.n_train()
    );
    let trainable = Trainable::function(move |ctx| train(ctx, &data)).scaling(ScalingConfig::workers(workers));
    let started = std::time::Instant::now();
    let mut tuner = Tuner::new(trainable, space(epochs));
    if pbt {
        // A CPU per worker thread of the whole population, whatever this machine has.
        tuner = tuner.resources(NodeResources::declared((trials * u64::from(workers)) as f64));
    }
    let grid = tuner
        .tune_config(TuneConfig {
            metric: Some("val_rmse".into()),
            mode: Some(Mode::Min),
            num_samples: trials,
            seed: Some(42),
            search: if scheduler_name == "bohb" { Algorithm::Bohb } else { Algorithm::Random },
            scheduler,
            ..Default::default()
        })
        .run_config(RunConfig {
            name,
            storage: storage.into(),
            stop: Stop::new().iterations(epochs),
            // A checkpoint at every rung, so paused trials resume where they stopped.
            checkpoint: CheckpointConfig { frequency: Some((epochs / 10).max(1).into()), ..Default::default() },
            ..Default::default()
        })
        .fit()?;

    let best = grid.best_result(None, None, Scope::Last)?;
    let val = best.metrics.as_ref().and_then(|m| m.get("val_rmse")).copied().unwrap_or(f64::NAN);
    let ran: usize = grid.iter().map(|t| t.history.len()).sum();
    let early = grid.iter().filter(|t| t.history.last().map_or(0, |r| r.training_iteration) < epochs).count();
    println!("{} trials: {} terminated, {} errors", grid.len(), grid.num_terminated(), grid.num_errors());
    println!("{ran} of {} epochs trained ({early} trials stopped early) in {:.1} s", trials * epochs, started.elapsed().as_secs_f64());
    println!("Best trial: {}", best.trial_id);
    println!("  config:     {}", best.config);
    println!("  val_rmse:   {val:.4}");
    let ckpt = best.best_checkpoint("val_rmse", Mode::Min).map(|c| c.uri.as_str());
    println!("  checkpoint: {}", ckpt.unwrap_or("none"));
    println!("  results:    {}", grid.experiment_dir.display());
    Ok(())
}
