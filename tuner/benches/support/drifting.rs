//! A problem whose best learning rate drifts during training, for
//! population-based training: noisy SGD on an ill-conditioned quadratic. A
//! large rate descends fast but stalls at a high noise floor; a small one
//! has a low floor but crawls. No constant rate does well; a decaying
//! schedule does, and PBT and PB2 can find one.
//!
//! Each trial is a real in-process training function with real checkpoints
//! (its weights, in a file) and the real loop and store. The noise depends
//! on the trial and the iteration only, so a run resumed from a checkpoint
//! replays what an unbroken one would have done.

#![allow(dead_code)]

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use schedulers::SchedulerConfig;
use tuner::{CheckpointConfig, Domain, Mode, NodeResources, ProgressMode, RunConfig, Space, Trainable, TuneConfig, Tuner};

const DIM: usize = 10;
const STEPS_PER_ITERATION: u64 = 10;
const NOISE: f64 = 1.0;

/// Curvatures log-spaced in [0.1, 1]: condition number 10.
fn curvature(i: usize) -> f64 {
    0.1 * 10f64.powf(i as f64 / (DIM - 1) as f64)
}

fn loss(w: &[f64]) -> f64 {
    w.iter().enumerate().map(|(i, x)| 0.5 * curvature(i) * x * x).sum()
}

fn gaussian(rng: &mut ChaCha8Rng) -> f64 {
    let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-300), rng.random());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// The training function: `iterations` iterations of `STEPS_PER_ITERATION`
/// noisy gradient steps at rate `lr`, reporting `loss`.
pub fn trainable(iterations: u64) -> Trainable {
    Trainable::function(move |ctx| {
        let lr: f64 = ctx.param("lr")?;
        let mut w = vec![5.0; DIM];
        if let Some(dir) = ctx.checkpoint() {
            w = serde_json::from_slice(&std::fs::read(dir.join("w.json"))?)?;
        }
        let scratch = ctx.trial_dir().join("scratch");
        let id: u64 = ctx.trial_id().trim_start_matches("trial_").parse().unwrap_or(0);
        for it in ctx.start_iteration() + 1..=iterations {
            // The noise depends on the trial and iteration only: a restart replays it.
            let mut rng = ChaCha8Rng::seed_from_u64(id << 32 | it);
            for _ in 0..STEPS_PER_ITERATION {
                for (i, x) in w.iter_mut().enumerate() {
                    let g = curvature(i) * *x + NOISE * gaussian(&mut rng);
                    *x -= lr * g;
                }
            }
            let ckpt = if ctx.should_checkpoint(it) {
                std::fs::create_dir_all(&scratch)?;
                std::fs::write(scratch.join("w.json"), serde_json::to_vec(&w)?)?;
                Some(scratch.clone())
            } else {
                None
            };
            let l = loss(&w);
            ctx.report([("loss", if l.is_finite() { l } else { f64::MAX })], ckpt.as_deref())?;
        }
        Ok(())
    })
}

/// A sweep of `trials` trials of `iterations` iterations, 4 at a time,
/// checkpointing every 10, under `scheduler`, in `dir/name-seed`: the best
/// final loss and the iterations run.
pub fn sweep(dir: &Path, name: &str, seed: u64, trials: u64, iterations: u64, scheduler: SchedulerConfig) -> (f64, u64) {
    let space = Space::builder().param("lr", Domain::loguniform(1e-3, 1.0)).build().unwrap_or_else(|e| panic!("{e}"));
    let tuner = Tuner::new(trainable(iterations), space)
        .resources(NodeResources::declared(4.0))
        .tune_config(TuneConfig {
            metric: Some("loss".into()),
            mode: Some(Mode::Min),
            num_samples: trials,
            max_concurrent_trials: Some(4),
            seed: Some(seed),
            scheduler,
            ..Default::default()
        })
        .run_config(RunConfig {
            name: format!("{name}-{seed}"),
            storage: dir.to_path_buf(),
            progress: ProgressMode::Quiet,
            checkpoint: CheckpointConfig { frequency: Some(10.into()), num_to_keep: Some(2), ..Default::default() },
            ..Default::default()
        });
    let grid = tuner.fit().unwrap_or_else(|e| panic!("{name}: {e}"));
    let best = grid.iter().filter_map(|t| t.metrics.as_ref().map(|m| m["loss"])).fold(f64::INFINITY, f64::min);
    let store = tuner::store::Store::open_existing(&dir.join(format!("{name}-{seed}/store"))).ok();
    drop(grid);
    let run = store.map_or(0, |s| s.all_results().map_or(0, |r| r.values().map(|v| v.len() as u64).sum()));
    (best, run)
}
