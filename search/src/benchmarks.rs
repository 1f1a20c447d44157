//! Standard test functions for searchers, with their spaces: Branin,
//! Hartmann-6 and a 10-dimensional mixed function (continuous, log-scaled,
//! integer and categorical parameters). All are minimised.

use serde_json::Value;

use crate::{Config, Domain, Searcher, Space, Suggestion, TrialResult};

/// A test function: its name, space, and value at a config.
pub struct TestFunction {
    /// The name.
    pub name: &'static str,
    /// Where it is searched.
    pub space: Space,
    /// Its global minimum.
    pub minimum: f64,
    /// The function.
    pub f: fn(&Config) -> f64,
}

fn x(c: &Config, k: &str) -> f64 {
    c.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn branin(c: &Config) -> f64 {
    let (x1, x2) = (x(c, "x1"), x(c, "x2"));
    let pi = std::f64::consts::PI;
    let (a, b, cc, r, s, t) = (1.0, 5.1 / (4.0 * pi * pi), 5.0 / pi, 6.0, 10.0, 1.0 / (8.0 * pi));
    a * (x2 - b * x1 * x1 + cc * x1 - r).powi(2) + s * (1.0 - t) * x1.cos() + s
}

fn hartmann6(c: &Config) -> f64 {
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    const A: [[f64; 6]; 4] = [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ];
    const P: [[f64; 6]; 4] = [
        [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
        [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
        [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
        [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
    ];
    let xs: Vec<f64> = (1..=6).map(|i| x(c, &format!("x{i}"))).collect();
    -(0..4).map(|i| ALPHA[i] * (-(0..6).map(|j| A[i][j] * (xs[j] - P[i][j]).powi(2)).sum::<f64>()).exp()).sum::<f64>()
}

const CATS: [&str; 4] = ["a", "b", "c", "d"];

fn mixed(c: &Config) -> f64 {
    let cont: f64 = (1..=4).map(|i| (x(c, &format!("u{i}")) - 0.5 * i as f64).powi(2) / 4.0).sum();
    let logs = (x(c, "lr").log10() + 3.0).powi(2) + 0.5 * (x(c, "wd").log10() + 5.0).powi(2);
    let int = ((x(c, "layers") - 6.0) / 3.0).powi(2);
    // Each categorical has one best value, a different one each.
    let cat: f64 = (0..3)
        .map(|i| {
            let v = c.get(format!("c{i}")).and_then(Value::as_str).unwrap_or("");
            let pos = CATS.iter().position(|k| *k == v).unwrap_or(4);
            [0.0, 0.6, 1.2, 2.0][(pos + 4 - i) % 4]
        })
        .sum();
    cont + logs + int + cat
}

/// Branin on `[-5, 10] x [0, 15]`; minimum 0.397887.
pub fn branin_fn() -> TestFunction {
    let space = Space::builder().param("x1", Domain::uniform(-5.0, 10.0)).param("x2", Domain::uniform(0.0, 15.0)).build();
    TestFunction { name: "Branin", space: space.unwrap_or_default(), minimum: 0.397_887, f: branin }
}

/// Hartmann-6 on `[0, 1]^6`; minimum -3.32237.
pub fn hartmann6_fn() -> TestFunction {
    let mut b = Space::builder();
    for i in 1..=6 {
        b = b.param(format!("x{i}"), Domain::uniform(0.0, 1.0));
    }
    TestFunction { name: "Hartmann-6", space: b.build().unwrap_or_default(), minimum: -3.322_37, f: hartmann6 }
}

/// Ten parameters: four uniform, two log-uniform, one integer and three
/// categorical; minimum 0.
pub fn mixed10_fn() -> TestFunction {
    let mut b = Space::builder();
    for i in 1..=4 {
        b = b.param(format!("u{i}"), Domain::uniform(-5.0, 5.0));
    }
    b = b.param("lr", Domain::loguniform(1e-6, 1.0)).param("wd", Domain::loguniform(1e-8, 1e-1)).param("layers", Domain::randint(1, 17));
    for i in 0..3 {
        b = b.param(format!("c{i}"), Domain::choice(CATS));
    }
    TestFunction { name: "Mixed-10", space: b.build().unwrap_or_default(), minimum: 0.0, f: mixed }
}

/// The three functions.
pub fn all() -> Vec<TestFunction> {
    vec![branin_fn(), hartmann6_fn(), mixed10_fn()]
}

/// The best value `searcher` finds in `trials` trials of `f` (reported as
/// the metric `y`, to be minimised).
pub fn best_of(searcher: &mut dyn Searcher, f: &TestFunction, trials: usize) -> f64 {
    let mut best = f64::INFINITY;
    for i in 0..trials {
        let id = format!("t{i}");
        let Suggestion::Config(c) = searcher.suggest(&id) else { break };
        let v = (f.f)(&c);
        best = best.min(v);
        let r = TrialResult {
            extra: None,
            trial_id: id.clone(),
            seq: 0,
            training_iteration: 1,
            metrics: [("y".into(), v)].into_iter().collect(),
            checkpoint: None,
        };
        searcher.on_trial_complete(&id, Some(&r), false);
    }
    best
}

/// The median over seeds `0..seeds` of [`best_of`] for the searcher
/// `make(space, seed)` builds.
pub fn median_best(make: impl Fn(Space, u64) -> Box<dyn Searcher>, f: &TestFunction, seeds: u64, trials: usize) -> f64 {
    let mut v: Vec<f64> = (0..seeds).map(|s| best_of(&mut *make(f.space.clone(), s), f, trials)).collect();
    v.sort_by(f64::total_cmp);
    (v[(v.len() - 1) / 2] + v[v.len() / 2]) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn known_minima() {
        let b = branin_fn();
        assert!(((b.f)(&json!({"x1": std::f64::consts::PI, "x2": 2.275})) - b.minimum).abs() < 1e-5);
        let h = hartmann6_fn();
        let at = json!({"x1": 0.20169, "x2": 0.150011, "x3": 0.476874, "x4": 0.275332, "x5": 0.311652, "x6": 0.6573});
        assert!(((h.f)(&at) - h.minimum).abs() < 1e-4);
        let m = mixed10_fn();
        let best =
            json!({"u1": 0.5, "u2": 1.0, "u3": 1.5, "u4": 2.0, "lr": 1e-3, "wd": 1e-5, "layers": 6, "c0": "a", "c1": "b", "c2": "c"});
        assert!((m.f)(&best).abs() < 1e-9);
        assert_eq!(m.space.len(), 10);
    }
}
