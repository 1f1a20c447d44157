//! TPE, the tree-structured Parzen estimator (Bergstra et al. 2011; Optuna's
//! default sampler).
//!
//! After `n_startup_trials` random configs, each suggestion splits the
//! completed trials into the best `gamma(n) = min(ceil(n / 10), 25)` ("good")
//! and the rest ("bad"), fits a Parzen estimator to each, draws
//! `n_ei_candidates` candidates from the good one and keeps the candidate
//! that maximises `l(x) / g(x)`, the expected improvement.
//!
//! - Numeric parameters are modelled on their range (log-scaled for log
//!   domains; randn domains on mean ± 4 sd) with truncated Gaussian kernels
//!   plus a wide prior kernel; bandwidths follow Optuna (the larger gap to a
//!   neighbour, clipped). Candidates are rounded and quantized into the
//!   domain, so integers and `q` domains keep their semantics.
//! - Choices (and grid axes) are categorical: kernels that favour the
//!   observed value, plus a uniform prior.
//! - Nested configs are flattened to their paths; constants are kept.
//! - Univariate by default (each parameter on its own, as Optuna's
//!   default); `multivariate` models the parameters jointly, one product
//!   kernel per observation (Falkner et al. 2018).
//! - Only completed trials count; a NaN or infinite final metric is the
//!   worst. Seeded: the `i`-th suggestion draws from its own stream of the
//!   seed, so a restored searcher continues the same sequence.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use statrs::function::erf::erf;

use crate::domain::Domain;
use crate::error::SearchError;
use crate::searcher::{Searcher, Suggestion};
use crate::space::{merge, Node, Space};
use crate::types::{Config, Mode, TrialResult};

/// TPE's settings (Optuna's names and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpeOptions {
    /// Random configs before the model takes over (default 10).
    #[serde(default = "ten")]
    pub n_startup_trials: usize,
    /// Candidates drawn from the good estimator per suggestion (default 24).
    #[serde(default = "twenty_four")]
    pub n_ei_candidates: usize,
    /// Model the parameters jointly (default false: each on its own).
    #[serde(default)]
    pub multivariate: bool,
}

fn ten() -> usize {
    10
}
fn twenty_four() -> usize {
    24
}

impl Default for TpeOptions {
    fn default() -> Self {
        Self { n_startup_trials: ten(), n_ei_candidates: twenty_four(), multivariate: false }
    }
}

/// One parameter as the model sees it.
#[derive(Debug, Clone)]
pub(crate) enum Param {
    Numeric { domain: Domain, lo: f64, hi: f64 },
    Categorical(Vec<Value>),
    Fixed(Value),
}

impl Param {
    pub(crate) fn encode(&self, v: &Value) -> Option<f64> {
        match self {
            Param::Numeric { domain, lo, hi } => domain.to_model(v).map(|x| x.clamp(*lo, *hi)),
            Param::Categorical(values) => values.iter().position(|c| c == v).map(|i| i as f64),
            Param::Fixed(_) => Some(0.0),
        }
    }
    pub(crate) fn decode(&self, x: f64) -> Value {
        match self {
            Param::Numeric { domain, .. } => domain.value_at_model(x),
            Param::Categorical(values) => values.get(x as usize).cloned().unwrap_or(Value::Null),
            Param::Fixed(v) => v.clone(),
        }
    }
}

pub(crate) fn flatten(space: &Space, prefix: &[String], out: &mut Vec<(Vec<String>, Param)>) {
    for (name, node) in space.entries() {
        let mut path = prefix.to_vec();
        path.push(name.to_string());
        match node {
            Node::Nested(s) => flatten(s, &path, out),
            Node::Domain(d) => {
                let p = match (d, d.model_range()) {
                    (_, Some((lo, hi, _))) => Param::Numeric { domain: d.clone(), lo, hi },
                    (Domain::Choice(v) | Domain::Grid(v), None) => Param::Categorical(v.clone()),
                    (Domain::Const(v), None) => Param::Fixed(v.clone()),
                    (other, None) => Param::Fixed(other.value_at_model(0.0)),
                };
                out.push((path, p));
            }
        }
    }
}

pub(crate) fn lookup<'a>(config: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(config, |v, k| v.get(k))
}

pub(crate) fn insert(config: &mut Map<String, Value>, path: &[String], value: Value) {
    match path {
        [] => {}
        [last] => {
            config.insert(last.clone(), value);
        }
        [head, rest @ ..] => {
            let entry = config.entry(head.clone()).or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = entry {
                insert(m, rest, value);
            }
        }
    }
}

/// A kernel over one parameter.
#[derive(Debug, Clone)]
enum Kernel {
    /// A Gaussian truncated to `[lo, hi]`.
    Gauss { mu: f64, sigma: f64, lo: f64, hi: f64 },
    /// Probabilities of each category.
    Cat(Vec<f64>),
    /// A constant.
    Fixed,
}

const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

fn phi(z: f64) -> f64 {
    0.5 * (1.0 + erf(z / std::f64::consts::SQRT_2))
}

impl Kernel {
    fn log_pdf(&self, x: f64) -> f64 {
        match self {
            Kernel::Gauss { mu, sigma, lo, hi } => {
                let z = (x - mu) / sigma;
                let mass = (phi((hi - mu) / sigma) - phi((lo - mu) / sigma)).max(1e-12);
                -0.5 * z * z - LN_SQRT_2PI - sigma.ln() - mass.ln()
            }
            Kernel::Cat(p) => p.get(x as usize).copied().unwrap_or(0.0).max(1e-12).ln(),
            Kernel::Fixed => 0.0,
        }
    }

    fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        match self {
            Kernel::Gauss { mu, sigma, lo, hi } => {
                for _ in 0..100 {
                    let x = mu + sigma * standard_normal(rng);
                    if (*lo..=*hi).contains(&x) {
                        return x;
                    }
                }
                rng.random_range(*lo..=*hi)
            }
            Kernel::Cat(p) => {
                let mut u = rng.random::<f64>() * p.iter().sum::<f64>();
                for (i, w) in p.iter().enumerate() {
                    if u < *w {
                        return i as f64;
                    }
                    u -= w;
                }
                (p.len().max(1) - 1) as f64
            }
            Kernel::Fixed => 0.0,
        }
    }
}

/// Of `n` candidates drawn from `draw`, the one that maximises
/// `l(x) / g(x)` (the expected improvement); the first on a tie.
pub(crate) fn best_candidate(l: &Estimator, g: &Estimator, draw: &Estimator, n: usize, rng: &mut ChaCha8Rng) -> Option<Vec<f64>> {
    (0..n)
        .map(|_| draw.sample(rng))
        .map(|x| {
            let ei = l.log_pdf(&x) - g.log_pdf(&x);
            (x, ei)
        })
        .fold(None::<(Vec<f64>, f64)>, |acc, (x, ei)| match acc {
            Some((_, b)) if b >= ei => acc,
            _ => Some((x, ei)),
        })
        .map(|(x, _)| x)
}

/// The config of encoded values `x`, one per flattened parameter.
pub(crate) fn decode_config(params: &[(Vec<String>, Param)], x: Vec<f64>) -> Config {
    let mut map = Map::new();
    for ((path, p), v) in params.iter().zip(x) {
        insert(&mut map, path, p.decode(v));
    }
    Value::Object(map)
}

fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    // Box-Muller: two uniforms, one normal.
    let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn log_sum_exp(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// A Parzen estimator: equally weighted components, each a product of
/// one kernel per parameter (the last component is the prior).
#[derive(Debug, Clone)]
pub(crate) struct Estimator {
    components: Vec<Vec<Kernel>>,
}

impl Estimator {
    /// Fits `points` (rows of encoded parameters) over `params`.
    pub(crate) fn fit(points: &[Vec<f64>], params: &[&Param]) -> Self {
        let n = points.len();
        let mut components: Vec<Vec<Kernel>> = vec![Vec::with_capacity(params.len()); n + 1];
        for (d, p) in params.iter().enumerate() {
            match p {
                Param::Numeric { lo, hi, .. } => {
                    let (lo, hi) = (*lo, *hi);
                    let width = (hi - lo).max(1e-12);
                    let prior = (lo + hi) / 2.0;
                    // Bandwidths: the larger gap to a neighbour among the
                    // observations and the prior, clipped (Optuna's rule).
                    let mut sorted: Vec<f64> = points.iter().map(|r| r[d]).chain([prior]).collect();
                    sorted.sort_by(f64::total_cmp);
                    let min_sigma = width / (100.0f64).min(1.0 + n as f64);
                    let sigma_at = |x: f64| {
                        let i = sorted.partition_point(|v| *v < x);
                        let left = if i == 0 { x - lo } else { x - sorted[i - 1] };
                        let right = if i + 1 >= sorted.len() { hi - x } else { sorted[i + 1] - x };
                        left.max(right).clamp(min_sigma, width)
                    };
                    for (k, row) in points.iter().enumerate() {
                        components[k].push(Kernel::Gauss { mu: row[d], sigma: sigma_at(row[d]), lo, hi });
                    }
                    components[n].push(Kernel::Gauss { mu: prior, sigma: width, lo, hi });
                }
                Param::Categorical(values) => {
                    let k = values.len().max(1);
                    for (j, row) in points.iter().enumerate() {
                        let c = row[d] as usize;
                        let probs =
                            if k == 1 { vec![1.0] } else { (0..k).map(|i| if i == c { 0.8 } else { 0.2 / (k - 1) as f64 }).collect() };
                        components[j].push(Kernel::Cat(probs));
                    }
                    components[n].push(Kernel::Cat(vec![1.0 / k as f64; k]));
                }
                Param::Fixed(_) => {
                    for c in components.iter_mut() {
                        c.push(Kernel::Fixed);
                    }
                }
            }
        }
        Self { components }
    }

    pub(crate) fn log_pdf(&self, x: &[f64]) -> f64 {
        let ln_n = (self.components.len() as f64).ln();
        log_sum_exp(self.components.iter().map(|c| c.iter().zip(x).map(|(k, v)| k.log_pdf(*v)).sum::<f64>())) - ln_n
    }

    pub(crate) fn sample(&self, rng: &mut ChaCha8Rng) -> Vec<f64> {
        let c = &self.components[rng.random_range(0..self.components.len())];
        c.iter().map(|k| k.sample(rng)).collect()
    }

    /// The same estimator with every kernel `factor` times wider (BOHB
    /// samples candidates from it, to explore around the good points):
    /// Gaussians' bandwidths multiplied (up to the range), categorical
    /// kernels mixed with the uniform by `1 - 1/factor`.
    pub(crate) fn widened(&self, factor: f64) -> Self {
        let w = (1.0 - 1.0 / factor.max(1.0)).clamp(0.0, 1.0);
        let components = self
            .components
            .iter()
            .map(|c| {
                c.iter()
                    .map(|k| match k {
                        Kernel::Gauss { mu, sigma, lo, hi } => {
                            Kernel::Gauss { mu: *mu, sigma: (sigma * factor).min((hi - lo).max(1e-12)), lo: *lo, hi: *hi }
                        }
                        Kernel::Cat(p) => {
                            let u = 1.0 / p.len().max(1) as f64;
                            Kernel::Cat(p.iter().map(|q| (1.0 - w) * q + w * u).collect())
                        }
                        Kernel::Fixed => Kernel::Fixed,
                    })
                    .collect()
            })
            .collect();
        Self { components }
    }
}

/// What TPE and BOHB share: the flattened space, the objective, and the
/// seeded sequence of suggestions with the points to run first.
#[derive(Debug, Clone)]
pub(crate) struct Sequence {
    pub(crate) space: Space,
    pub(crate) params: Vec<(Vec<String>, Param)>,
    pub(crate) metric: String,
    pub(crate) mode: Mode,
    seed: u64,
    points: Vec<Config>,
    suggested: u64,
}

impl Sequence {
    pub(crate) fn new(space: Space, metric: String, mode: Mode, seed: u64) -> Self {
        let mut params = Vec::new();
        flatten(&space, &[], &mut params);
        Self { space, params, metric, mode, seed, points: Vec::new(), suggested: 0 }
    }

    /// Configs (possibly partial) to run first; checked against the space.
    pub(crate) fn set_points(&mut self, points: Vec<Config>) -> Result<(), SearchError> {
        for (i, p) in points.iter().enumerate() {
            self.space.check_point(p, &format!("points_to_evaluate[{i}]"))?;
        }
        self.points = points;
        Ok(())
    }

    /// The next suggestion's generator: its own stream of the seed.
    pub(crate) fn rng(&self) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(self.suggested);
        rng
    }

    /// Whether the next suggestion is one of the points to run first.
    pub(crate) fn at_a_point(&self) -> bool {
        (self.suggested as usize) < self.points.len()
    }

    /// Ends the next suggestion: its point to run first laid over `config`.
    pub(crate) fn finish(&mut self, mut config: Config) -> Config {
        if let Some(point) = self.points.get(self.suggested as usize) {
            merge(&mut config, point);
        }
        self.suggested += 1;
        config
    }

    /// A result's score (larger is better; `None` when not finite), if it has the metric.
    pub(crate) fn score(&self, result: &TrialResult) -> Option<Option<f64>> {
        result.metric(&self.metric).map(|v| v.is_finite().then(|| self.mode.score(v)))
    }

    /// The saved state: this sequence's place, the live trials and the observations.
    pub(crate) fn save(&self, kind: &str, live: &impl Serialize, observations: &impl Serialize) -> Value {
        json!({
            "version": 1,
            "kind": kind,
            "seed": self.seed,
            "suggested": self.suggested,
            "live": live,
            "observations": observations,
        })
    }

    /// Reads a state [`Sequence::save`] wrote for `kind` (`name` in errors);
    /// nothing changes unless all of it reads.
    pub(crate) fn restore<L: DeserializeOwned, O: DeserializeOwned>(
        &mut self,
        state: &Value,
        kind: &str,
        name: &str,
    ) -> Result<(L, O), SearchError> {
        if state["version"].as_u64() != Some(1) || state["kind"] != kind {
            return Err(SearchError::State(format!("not a version-1 {name} state: {state}")));
        }
        if state["seed"].as_u64() != Some(self.seed) {
            return Err(SearchError::State(format!("state was saved with seed {}, this searcher has seed {}", state["seed"], self.seed)));
        }
        let err = |e: serde_json::Error| SearchError::State(format!("{name} state: {e}"));
        let suggested = state["suggested"].as_u64().ok_or_else(|| SearchError::State(format!("{name} state: missing `suggested`")))?;
        let live = serde_json::from_value(state["live"].clone()).map_err(err)?;
        let observations = serde_json::from_value(state["observations"].clone()).map_err(err)?;
        self.suggested = suggested;
        Ok((live, observations))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Observation {
    config: Config,
    /// Larger is better; `None` for a non-finite metric (the worst).
    score: Option<f64>,
}

/// The TPE searcher; see the module documentation.
#[derive(Debug, Clone)]
pub struct Tpe {
    seq: Sequence,
    options: TpeOptions,
    live: BTreeMap<String, Config>,
    observations: Vec<Observation>,
}

impl Tpe {
    /// TPE over `space`, minimising or maximising `metric`.
    pub fn new(space: Space, metric: impl Into<String>, mode: Mode, seed: u64, options: TpeOptions) -> Self {
        Self { seq: Sequence::new(space, metric.into(), mode, seed), options, live: BTreeMap::new(), observations: Vec::new() }
    }

    /// Configs (possibly partial) to run first; checked against the space.
    pub fn with_points(mut self, points: Vec<Config>) -> Result<Self, SearchError> {
        self.seq.set_points(points)?;
        Ok(self)
    }

    /// Completed trials the model has learnt from.
    pub fn observed(&self) -> usize {
        self.observations.len()
    }

    fn model_config(&self, rng: &mut ChaCha8Rng) -> Config {
        let mut ranked: Vec<&Observation> = self.observations.iter().collect();
        ranked.sort_by(|a, b| b.score.unwrap_or(f64::NEG_INFINITY).total_cmp(&a.score.unwrap_or(f64::NEG_INFINITY)));
        let n = ranked.len();
        let n_good = (n.div_ceil(10)).clamp(1, 25);
        let encode = |o: &Observation, dims: &[usize]| -> Option<Vec<f64>> {
            dims.iter().map(|&d| self.seq.params[d].1.encode(lookup(&o.config, &self.seq.params[d].0)?)).collect()
        };
        let mut chosen: Vec<f64> = vec![0.0; self.seq.params.len()];
        let groups: Vec<Vec<usize>> = if self.options.multivariate {
            vec![(0..self.seq.params.len()).collect()]
        } else {
            (0..self.seq.params.len()).map(|d| vec![d]).collect()
        };
        for dims in groups {
            let params: Vec<&Param> = dims.iter().map(|&d| &self.seq.params[d].1).collect();
            let good: Vec<Vec<f64>> = ranked[..n_good].iter().filter_map(|o| encode(o, &dims)).collect();
            let bad: Vec<Vec<f64>> = ranked[n_good..].iter().filter_map(|o| encode(o, &dims)).collect();
            let (l, g) = (Estimator::fit(&good, &params), Estimator::fit(&bad, &params));
            if let Some(x) = best_candidate(&l, &g, &l, self.options.n_ei_candidates.max(1), rng) {
                for (i, &d) in dims.iter().enumerate() {
                    chosen[d] = x[i];
                }
            }
        }
        decode_config(&self.seq.params, chosen)
    }
}

impl Searcher for Tpe {
    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        let mut rng = self.seq.rng();
        let config = if self.observations.len() < self.options.n_startup_trials.max(1) || self.seq.at_a_point() {
            self.seq.space.sample(&mut rng, 0)
        } else {
            self.model_config(&mut rng)
        };
        let config = self.seq.finish(config);
        self.live.insert(trial_id.to_string(), config.clone());
        Suggestion::Config(config)
    }

    fn on_trial_complete(&mut self, trial_id: &str, result: Option<&TrialResult>, error: bool) {
        let Some(config) = self.live.remove(trial_id) else { return };
        if error {
            return;
        }
        let Some(score) = result.and_then(|r| self.seq.score(r)) else { return };
        self.observations.push(Observation { config, score });
    }

    fn save(&self) -> Value {
        self.seq.save("tpe", &self.live, &self.observations)
    }

    fn restore(&mut self, state: &Value) -> Result<(), SearchError> {
        (self.live, self.observations) = self.seq.restore(state, "tpe", "TPE")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> Space {
        Space::builder()
            .param("lr", Domain::loguniform(1e-5, 1e-1))
            .param("width", Domain::qrandint(16, 256, 16))
            .param("layers", Domain::randint(1, 5))
            .param("act", Domain::choice(["relu", "tanh", "gelu"]))
            .param("drop", Domain::quniform(0.0, 0.5, 0.05))
            .param("noise", Domain::qrandn(0.0, 1.0, 0.1))
            .param("k", Domain::qlograndint(2, 64, 2))
            .param("n", Domain::lograndint(1, 100))
            .param("s", Domain::qloguniform(0.01, 10.0, 0.01))
            .constant("epochs", 3)
            .nested("opt", Space::builder().param("beta", Domain::uniform(0.8, 0.99)).param("kind", Domain::grid(["adam", "sgd"])))
            .build()
            .unwrap()
    }

    fn objective(c: &Config) -> f64 {
        let lr = c["lr"].as_f64().unwrap();
        let w = c["width"].as_f64().unwrap();
        let act = if c["act"] == "gelu" { 0.0 } else { 1.0 };
        (lr.log10() + 3.0).powi(2) + ((w - 128.0) / 64.0).powi(2) + act + (c["opt"]["beta"].as_f64().unwrap() - 0.9).abs()
    }

    fn run(tpe: &mut Tpe, n: usize) -> Vec<(Config, f64)> {
        let mut out = Vec::new();
        for i in 0..n {
            let id = format!("t{i}");
            let Suggestion::Config(c) = tpe.suggest(&id) else { panic!("no config") };
            let v = objective(&c);
            let r = TrialResult {
                extra: None,
                trial_id: id.clone(),
                seq: 0,
                training_iteration: 1,
                metrics: [("loss".into(), v)].into_iter().collect(),
                checkpoint: None,
            };
            tpe.on_trial_complete(&id, Some(&r), false);
            out.push((c, v));
        }
        out
    }

    #[test]
    fn every_suggestion_lies_in_its_domain() {
        for multivariate in [false, true] {
            let s = space();
            let mut tpe = Tpe::new(s.clone(), "loss", Mode::Min, 7, TpeOptions { multivariate, ..Default::default() });
            for (c, _) in run(&mut tpe, 60) {
                s.check_point(&c, "suggestion").unwrap();
                assert_eq!(c["epochs"], 3);
                assert_eq!(c.as_object().unwrap().len(), 11, "{c}");
            }
        }
    }

    #[test]
    fn the_model_concentrates_on_the_good_region() {
        let mut tpe = Tpe::new(space(), "loss", Mode::Min, 3, TpeOptions::default());
        let all = run(&mut tpe, 80);
        let (head, tail) = all.split_at(20);
        let gelu = |xs: &[(Config, f64)]| xs.iter().filter(|(c, _)| c["act"] == "gelu").count() as f64 / xs.len() as f64;
        // Random picks gelu a third of the time; the model, most of the time.
        assert!(gelu(tail) > 0.6, "gelu share after startup: {}", gelu(tail));
        let mean = |xs: &[(Config, f64)]| xs.iter().map(|(_, v)| v).sum::<f64>() / xs.len() as f64;
        assert!(mean(tail) < 0.7 * mean(head), "model {} vs startup {}", mean(tail), mean(head));
    }

    #[test]
    fn seeded_restorable_and_refusing_another_seed() {
        let mut a = Tpe::new(space(), "loss", Mode::Min, 11, TpeOptions::default());
        let first = run(&mut a, 25);
        let mut b = Tpe::new(space(), "loss", Mode::Min, 11, TpeOptions::default());
        assert_eq!(run(&mut b, 25), first);
        let mut c = Tpe::new(space(), "loss", Mode::Min, 11, TpeOptions::default());
        c.restore(&a.save()).unwrap();
        assert_eq!(run(&mut c, 10), run(&mut a, 10));
        let mut other = Tpe::new(space(), "loss", Mode::Min, 12, TpeOptions::default());
        assert!(other.restore(&a.save()).unwrap_err().to_string().contains("seed"));
    }

    #[test]
    fn failed_and_non_finite_trials_are_handled() {
        let mut tpe = Tpe::new(space(), "loss", Mode::Max, 1, TpeOptions { n_startup_trials: 2, ..Default::default() });
        for i in 0..6 {
            let id = format!("t{i}");
            let _ = tpe.suggest(&id);
            let v = if i % 2 == 0 { f64::NAN } else { i as f64 };
            let r = TrialResult {
                extra: None,
                trial_id: id.clone(),
                seq: 0,
                training_iteration: 1,
                metrics: [("loss".into(), v)].into_iter().collect(),
                checkpoint: None,
            };
            tpe.on_trial_complete(&id, Some(&r), i == 5);
        }
        // The failed trial is not learnt from; the NaN ones are, as the worst.
        assert_eq!(tpe.observed(), 5);
        assert!(matches!(tpe.suggest("t6"), Suggestion::Config(_)));
    }
}
