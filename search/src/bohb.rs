//! BOHB's searcher (Falkner et al. 2018; Ray's `TuneBOHB`): TPE models per
//! budget, for HyperBand's brackets.
//!
//! Every trial's result at the budget it was paused at (or ended at) is an
//! observation at that budget (its `time_attr`, `training_iteration` by
//! default). A suggestion is random with probability `random_fraction`, and
//! while no budget has `min_points_in_model + 2` observations
//! (`min_points_in_model` defaults to the number of parameters plus one).
//! Otherwise the model is the largest such budget's: its best
//! `max(min_points_in_model, top_n_percent %)` observations fit the good
//! multivariate Parzen estimator `l`, its worst `max(min_points_in_model, the
//! rest)` the bad one `g`; `num_samples` candidates are drawn from `l` with
//! its bandwidths `bandwidth_factor` times wider, and the one maximising
//! `l(x) / g(x)` wins. Numeric parameters are modelled on their (log)
//! range, choices as categories, as in [`crate::Tpe`]. Seeded: the `i`-th
//! suggestion draws from its own stream of the seed.

use std::collections::BTreeMap;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::SearchError;
use crate::searcher::{Searcher, Suggestion};
use crate::space::Space;
use crate::tpe::{best_candidate, decode_config, lookup, Estimator, Param, Sequence};
use crate::types::{Config, Mode, TrialResult};

/// BOHB's settings (the names and defaults of Falkner et al.'s `hpbandster`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BohbOptions {
    /// The budget a result is observed at (default `training_iteration`).
    #[serde(default = "training_iteration")]
    pub time_attr: String,
    /// Observations a model needs, beyond 2 (default: parameters + 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_points_in_model: Option<usize>,
    /// The share of a budget's observations in the good estimator, in percent (default 15).
    #[serde(default = "fifteen")]
    pub top_n_percent: f64,
    /// The share of suggestions drawn at random, whatever the model (default 1/3).
    #[serde(default = "third")]
    pub random_fraction: f64,
    /// Candidates drawn from the good estimator per suggestion (default 64).
    #[serde(default = "sixty_four")]
    pub num_samples: usize,
    /// How much wider the good estimator's kernels are when drawing candidates (default 3).
    #[serde(default = "three")]
    pub bandwidth_factor: f64,
}

fn training_iteration() -> String {
    "training_iteration".into()
}
fn fifteen() -> f64 {
    15.0
}
fn third() -> f64 {
    1.0 / 3.0
}
fn sixty_four() -> usize {
    64
}
fn three() -> f64 {
    3.0
}

impl Default for BohbOptions {
    fn default() -> Self {
        Self {
            time_attr: training_iteration(),
            min_points_in_model: None,
            top_n_percent: fifteen(),
            random_fraction: third(),
            num_samples: sixty_four(),
            bandwidth_factor: three(),
        }
    }
}

impl BohbOptions {
    /// Checks the settings; the error names the field.
    pub fn check(&self) -> Result<(), (String, String)> {
        if !(self.top_n_percent > 0.0 && self.top_n_percent < 100.0) {
            return Err(("top_n_percent".into(), format!("must be in (0, 100), got {}", self.top_n_percent)));
        }
        if !(0.0..=1.0).contains(&self.random_fraction) {
            return Err(("random_fraction".into(), format!("must be in [0, 1], got {}", self.random_fraction)));
        }
        if self.num_samples == 0 {
            return Err(("num_samples".into(), "must be at least 1".into()));
        }
        if !(self.bandwidth_factor >= 1.0 && self.bandwidth_factor.is_finite()) {
            return Err(("bandwidth_factor".into(), format!("must be 1 or more, got {}", self.bandwidth_factor)));
        }
        if self.min_points_in_model == Some(0) {
            return Err(("min_points_in_model".into(), "must be at least 1".into()));
        }
        Ok(())
    }
}

/// One trial's result at one budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Observation {
    budget: f64,
    config: Config,
    /// Larger is better; `None` for a non-finite metric (the worst).
    score: Option<f64>,
}

/// A live trial: its config and its latest result (budget, score).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Live {
    config: Config,
    latest: Option<(f64, Option<f64>)>,
    /// The budget of its latest observation, so one is not recorded twice.
    observed: Option<f64>,
}

/// The BOHB searcher; see the module documentation.
#[derive(Debug, Clone)]
pub struct Bohb {
    seq: Sequence,
    options: BohbOptions,
    live: BTreeMap<String, Live>,
    observations: Vec<Observation>,
}

impl Bohb {
    /// BOHB over `space`, minimising or maximising `metric`.
    pub fn new(space: Space, metric: impl Into<String>, mode: Mode, seed: u64, options: BohbOptions) -> Self {
        Self { seq: Sequence::new(space, metric.into(), mode, seed), options, live: BTreeMap::new(), observations: Vec::new() }
    }

    /// Configs (possibly partial) to run first; checked against the space.
    pub fn with_points(mut self, points: Vec<Config>) -> Result<Self, SearchError> {
        self.seq.set_points(points)?;
        Ok(self)
    }

    /// How many observations each budget has.
    pub fn observed(&self) -> BTreeMap<u64, usize> {
        let mut out = BTreeMap::new();
        for o in &self.observations {
            *out.entry(o.budget.to_bits()).or_insert(0) += 1;
        }
        out.into_iter().map(|(b, n)| (f64::from_bits(b) as u64, n)).collect()
    }

    fn min_points(&self) -> usize {
        self.options.min_points_in_model.unwrap_or(self.seq.params.len() + 1)
    }

    /// The largest budget with enough observations to model, and them.
    fn model_budget(&self) -> Option<Vec<&Observation>> {
        let mut by_budget: BTreeMap<u64, Vec<&Observation>> = BTreeMap::new();
        for o in &self.observations {
            by_budget.entry(o.budget.to_bits()).or_default().push(o);
        }
        by_budget.into_values().rev().find(|obs| obs.len() >= self.min_points() + 2)
    }

    fn model_config(&self, rng: &mut ChaCha8Rng) -> Option<Config> {
        let mut ranked = self.model_budget()?;
        ranked.sort_by(|a, b| b.score.unwrap_or(f64::NEG_INFINITY).total_cmp(&a.score.unwrap_or(f64::NEG_INFINITY)));
        let n = ranked.len();
        let n_min = self.min_points();
        let n_good = n_min.max((self.options.top_n_percent * n as f64 / 100.0) as usize).min(n);
        let n_bad = n_min.max(n - n_good).min(n);
        let encode =
            |o: &Observation| -> Option<Vec<f64>> { self.seq.params.iter().map(|(path, p)| p.encode(lookup(&o.config, path)?)).collect() };
        let params: Vec<&Param> = self.seq.params.iter().map(|(_, p)| p).collect();
        let good: Vec<Vec<f64>> = ranked[..n_good].iter().filter_map(|o| encode(o)).collect();
        let bad: Vec<Vec<f64>> = ranked[n - n_bad..].iter().filter_map(|o| encode(o)).collect();
        let (l, g) = (Estimator::fit(&good, &params), Estimator::fit(&bad, &params));
        let wide = l.widened(self.options.bandwidth_factor);
        let x = best_candidate(&l, &g, &wide, self.options.num_samples, rng)?;
        Some(decode_config(&self.seq.params, x))
    }

    /// Records `trial`'s latest result as an observation at its budget.
    fn observe(&mut self, trial_id: &str) {
        let Some(live) = self.live.get_mut(trial_id) else { return };
        let Some((budget, score)) = live.latest else { return };
        if live.observed == Some(budget) {
            return;
        }
        live.observed = Some(budget);
        self.observations.push(Observation { budget, config: live.config.clone(), score });
    }
}

impl Searcher for Bohb {
    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        let mut rng = self.seq.rng();
        let random = self.seq.at_a_point() || rng.random::<f64>() < self.options.random_fraction;
        let config = match random {
            true => None,
            false => self.model_config(&mut rng),
        }
        .unwrap_or_else(|| self.seq.space.sample(&mut rng, 0));
        let config = self.seq.finish(config);
        self.live.insert(trial_id.to_string(), Live { config: config.clone(), latest: None, observed: None });
        Suggestion::Config(config)
    }

    fn on_trial_result(&mut self, trial_id: &str, result: &TrialResult) {
        let (Some(budget), Some(score)) = (result.metric(&self.options.time_attr), self.seq.score(result)) else { return };
        if let Some(live) = self.live.get_mut(trial_id) {
            live.latest = Some((budget, score));
        }
    }

    /// HyperBand pauses a trial at its bracket's budget: its result there is an observation.
    fn on_trial_pause(&mut self, trial_id: &str) {
        self.observe(trial_id);
    }

    fn on_trial_complete(&mut self, trial_id: &str, result: Option<&TrialResult>, error: bool) {
        if !error {
            if let Some(r) = result {
                self.on_trial_result(trial_id, r);
            }
            self.observe(trial_id);
        }
        self.live.remove(trial_id);
    }

    fn save(&self) -> Value {
        self.seq.save("bohb", &self.live, &self.observations)
    }

    fn restore(&mut self, state: &Value) -> Result<(), SearchError> {
        (self.live, self.observations) = self.seq.restore(state, "bohb", "BOHB")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::Domain;

    fn space() -> Space {
        Space::builder().param("x", Domain::uniform(0.0, 1.0)).param("act", Domain::choice(["relu", "tanh", "gelu"])).build().unwrap()
    }

    fn result(trial: &str, t: u64, loss: f64) -> TrialResult {
        TrialResult {
            extra: None,
            trial_id: trial.into(),
            seq: t,
            training_iteration: t,
            metrics: [("loss".to_string(), loss)].into_iter().collect(),
            checkpoint: None,
        }
    }

    /// The loss at budget `b` of a config: the best x is 0.8 with gelu; a
    /// larger budget lowers every loss alike.
    fn loss(c: &Config, b: u64) -> f64 {
        let x = c["x"].as_f64().unwrap();
        (x - 0.8).powi(2) + if c["act"] == "gelu" { 0.0 } else { 0.3 } + 1.0 / b as f64
    }

    /// Runs `n` trials to budget 1, pausing each (an observation at budget
    /// 1); every third also to budget 3. Returns the configs in order.
    fn run(b: &mut Bohb, n: usize, offset: usize) -> Vec<Config> {
        let mut configs = Vec::new();
        for i in offset..offset + n {
            let id = format!("t{i}");
            let Suggestion::Config(c) = b.suggest(&id) else { panic!("no config") };
            b.on_trial_result(&id, &result(&id, 1, loss(&c, 1)));
            b.on_trial_pause(&id);
            if i % 3 == 0 {
                b.on_trial_resume(&id);
                b.on_trial_result(&id, &result(&id, 3, loss(&c, 3)));
            }
            b.on_trial_complete(&id, None, false);
            configs.push(c);
        }
        configs
    }

    #[test]
    fn observations_land_at_their_budget_and_the_model_concentrates_on_the_good_region() {
        let mut b = Bohb::new(space(), "loss", Mode::Min, 3, BohbOptions::default());
        let first = run(&mut b, 30, 0);
        // 30 at budget 1 (paused there), 10 at budget 3 (ended there, after the resume).
        assert_eq!(b.observed(), [(1, 30), (3, 10)].into_iter().collect());
        let later = run(&mut b, 60, 30);
        let good = |cs: &[Config]| cs.iter().filter(|c| (c["x"].as_f64().unwrap() - 0.8).abs() < 0.15 && c["act"] == "gelu").count();
        // Random search puts 10% there (x within 0.15 of 0.8, one act of 3); the model far more.
        assert!(good(&later) * 100 > 25 * later.len(), "{} of {}", good(&later), later.len());
        for c in first.iter().chain(&later) {
            space().check_point(c, "config").unwrap();
        }
    }

    #[test]
    fn seeded_and_restorable() {
        let mut a = Bohb::new(space(), "loss", Mode::Min, 9, BohbOptions::default());
        run(&mut a, 20, 0);
        let mut b = Bohb::new(space(), "loss", Mode::Min, 9, BohbOptions::default());
        b.restore(&a.save()).unwrap();
        assert_eq!(run(&mut a, 10, 20), run(&mut b, 10, 20));
        let mut other = Bohb::new(space(), "loss", Mode::Min, 10, BohbOptions::default());
        assert!(other.restore(&a.save()).is_err());
    }

    #[test]
    fn settings_are_checked_naming_the_field() {
        let bad = |o: BohbOptions| o.check().unwrap_err().0;
        assert_eq!(bad(BohbOptions { top_n_percent: 0.0, ..Default::default() }), "top_n_percent");
        assert_eq!(bad(BohbOptions { random_fraction: 1.5, ..Default::default() }), "random_fraction");
        assert_eq!(bad(BohbOptions { bandwidth_factor: 0.5, ..Default::default() }), "bandwidth_factor");
        assert_eq!(bad(BohbOptions { num_samples: 0, ..Default::default() }), "num_samples");
        assert_eq!(BohbOptions::default().check(), Ok(()));
    }
}
