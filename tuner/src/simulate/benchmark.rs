//! A benchmark of learning curves, and how to score a sweep on it.
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::curves::Curve;
use crate::ResultGrid;
use search::Config;

/// `n` configurations of a made-up model whose loss curves cross: each
/// has a final loss (a few good ones among many: `0.1 + 0.9 sqrt(u)` for
/// a uniform `u`) and a learning speed of its own. `correlation` (0 to 1)
/// is how much a good final loss comes with fast learning: at 0 the
/// speed is unrelated to the final loss (early rankings say little); as
/// in real training, some correlation makes early results a hint. Every
/// curve runs 81 iterations with a little noise; an iteration takes 1 to
/// 3 virtual seconds.
pub fn crossing_curves(n: usize, seed: u64, correlation: f64) -> Vec<(Config, Curve)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let u: f64 = rng.random();
            let w: f64 = rng.random();
            let (curve, rate) = crossing_curve(u, w, correlation, &mut rng);
            (serde_json::json!({ "arm": i, "rate": rate, "quality": u }), curve)
        })
        .collect()
}

/// One curve of the family: `u` in [0, 1) sets the final loss (`0.1 +
/// 0.9 sqrt(u)`: small is good), `w` in [0, 1) the learning speed
/// together with `u` as `correlation` says. Returns it and its rate.
fn crossing_curve(u: f64, w: f64, correlation: f64, rng: &mut ChaCha8Rng) -> (Curve, f64) {
    let last = 0.1 + 0.9 * u.clamp(0.0, 1.0).sqrt();
    // Speed on a log scale from 0.03 to 0.5 per iteration.
    let speed = correlation * (1.0 - u) + (1.0 - correlation) * w;
    let rate = (0.03f64.ln() + speed * (0.5f64.ln() - 0.03f64.ln())).exp();
    let start = 1.5 + rng.random_range(0.0..0.5);
    let metrics = (1..=81).map(|t| last + (start - last) * (-rate * t as f64).exp() + rng.random_range(-0.005..0.005)).collect();
    (Curve::new(metrics, rng.random_range(1.0..3.0)), rate)
}

/// The same family over a continuous space, for model-based searchers:
/// a config `{ quality, speed }` (each uniform in [0, 1)) is the curve of
/// `u = quality`, `w = speed`, its noise seeded by the config.
pub fn crossing_space(correlation: f64) -> (search::Space, crate::curves::Curves) {
    let space = search::Space::builder()
        .param("quality", search::Domain::uniform(0.0, 1.0))
        .param("speed", search::Domain::uniform(0.0, 1.0))
        .build()
        .unwrap_or_default();
    let curves = crate::curves::Curves::from_fn("loss", move |c: &Config| {
        let (u, w) = (c["quality"].as_f64().unwrap_or(1.0), c["speed"].as_f64().unwrap_or(0.0));
        let mut rng = ChaCha8Rng::seed_from_u64(u.to_bits() ^ w.to_bits().rotate_left(17));
        crossing_curve(u, w, correlation, &mut rng).0
    });
    (space, curves)
}

/// Simulates a sweep on `crossing_space(correlation)`, as [`run`] does.
pub fn run_space(dir: &std::path::Path, name: &str, correlation: f64, tune: crate::TuneConfig) -> Result<ResultGrid, crate::TuneError> {
    let (space, curves) = crossing_space(correlation);
    simulate(dir, name, space, curves, tune)
}

/// Simulates a sweep on `crossing_curves(400, 7, correlation)`,
/// minimising `loss` with 8 slots (unless `tune` says otherwise),
/// checkpointing every iteration, into `<dir>/<name>`.
pub fn run(dir: &std::path::Path, name: &str, correlation: f64, tune: crate::TuneConfig) -> Result<ResultGrid, crate::TuneError> {
    let curves = crate::curves::Curves::from_table("loss", crossing_curves(400, 7, correlation));
    simulate(dir, name, search::Space::default(), curves, tune)
}

fn simulate(
    dir: &std::path::Path,
    name: &str,
    space: search::Space,
    curves: crate::curves::Curves,
    tune: crate::TuneConfig,
) -> Result<ResultGrid, crate::TuneError> {
    let tune = crate::TuneConfig {
        metric: Some("loss".into()),
        mode: Some(search::Mode::Min),
        max_concurrent_trials: tune.max_concurrent_trials.or(Some(8)),
        ..tune
    };
    crate::Tuner::new(crate::Trainable::simulated(curves), space)
        .tune_config(tune)
        .run_config(crate::RunConfig {
            name: name.into(),
            storage: dir.to_path_buf(),
            checkpoint: crate::CheckpointConfig { frequency: Some(1.into()), ..Default::default() },
            progress: crate::ProgressMode::Quiet,
            ..Default::default()
        })
        .fit()
}

/// The anytime performance of a sweep: after each result, in the order
/// of the (virtual) clock, how many iterations have run in all and the
/// best metric among results at `max_t` (fully trained) so far.
pub fn anytime(grid: &ResultGrid, metric: &str, max_t: u64) -> Vec<(u64, f64)> {
    let mut all: Vec<(f64, u64, f64)> = grid
        .iter()
        .flat_map(|t| t.history.iter())
        .map(|r| {
            (r.metrics.get("timestamp").copied().unwrap_or(0.0), r.training_iteration, r.metrics.get(metric).copied().unwrap_or(f64::NAN))
        })
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut best = f64::INFINITY;
    all.iter()
        .enumerate()
        .map(|(i, &(_, it, v))| {
            if it >= max_t && v < best {
                best = v;
            }
            (i as u64 + 1, best)
        })
        .collect()
}

/// The iterations a sweep took to reach a fully trained metric of
/// `target` or better, if it did.
pub fn iterations_to_reach(curve: &[(u64, f64)], target: f64) -> Option<u64> {
    curve.iter().find(|(_, b)| *b <= target).map(|(i, _)| *i)
}

/// The best fully trained metric within `budget` iterations.
pub fn best_within(curve: &[(u64, f64)], budget: u64) -> f64 {
    curve.iter().take_while(|(i, _)| *i <= budget).last().map_or(f64::INFINITY, |(_, b)| *b)
}
