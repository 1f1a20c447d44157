//! Population-based training (Jaderberg et al. 2017), asynchronous, as Ray
//! Tune's `PopulationBasedTraining`.
//!
//! Every `perturbation_interval` of a trial's `time_attr`, the live trials
//! with a score are ranked. A trial in the bottom `quantile_fraction`
//! *exploits* one of the top `quantile_fraction`, picked at random: it
//! stops, takes that donor's latest committed checkpoint, and restarts from
//! it with the donor's config *explored*. A trial in the top or middle goes
//! on.
//!
//! Exploring changes each key of `hyperparam_mutations`: with probability
//! `resample_probability` (or when the value is not one the mutation can
//! produce) it is drawn afresh from the mutation; otherwise a list value
//! moves to a neighbour in the list and a number is multiplied by one of
//! `perturbation_factors` (1.2 or 0.8), then brought back into the
//! mutation's domain (clamped, rounded, quantized). A custom explore
//! function, if any, runs last.
//!
//! Where Ray's users get hurt, this one is strict: a trial with no committed
//! checkpoint is never a donor (the exploit would restart the recipient
//! from nothing), the donor's checkpoint is the latest one it committed (the
//! one the scheduler last saw with its results, never an older one), and a
//! recipient is not ranked again, nor chosen as a donor, until it has
//! reported from its new state.
//!
//! The random draws are seeded per perturbation, so a restored scheduler
//! makes the same choices as one that never stopped.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use search::{Config, Domain, TrialResult};

use crate::objective::{Objective, Score};
use crate::{Decision, Exploit, Scheduler, SchedulerError, TrialView};

/// What one hyperparameter may become when explored.
#[derive(Debug, Clone, PartialEq)]
pub enum Mutation {
    /// One of these values; perturbed to a neighbour in the list.
    Values(Vec<Value>),
    /// A numeric domain: resampled from it, or multiplied by a
    /// perturbation factor and brought back into it.
    Domain(Domain),
}

impl Mutation {
    /// Whether `value` is one this mutation can produce.
    pub fn contains(&self, value: &Value) -> bool {
        match self {
            Mutation::Values(v) => v.contains(value),
            Mutation::Domain(d) => d.contains(value),
        }
    }
}

/// A user's explore step, run after the built-in one on the explored
/// config (Ray's `custom_explore_fn`), with the perturbation's seeded RNG.
#[derive(Clone)]
pub struct CustomExplore(pub Arc<ExploreFn>);

/// The signature of a custom explore step.
pub type ExploreFn = dyn Fn(&mut Config, &mut dyn RngCore) + Send + Sync;

impl CustomExplore {
    /// Wraps a function.
    pub fn new<F: Fn(&mut Config, &mut dyn RngCore) + Send + Sync + 'static>(f: F) -> Self {
        Self(Arc::new(f))
    }
}

impl std::fmt::Debug for CustomExplore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CustomExplore(..)")
    }
}

impl PartialEq for CustomExplore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What the scheduler knows of one live trial.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Member {
    /// Creation order, for stable ranking on ties.
    order: u64,
    /// Its config as of its latest result (or exploit).
    config: Config,
    /// Its latest score; `None` until it reports (again, after an exploit).
    score: Option<Score>,
    /// `time_attr` at its last perturbation check.
    last_perturbation: f64,
    /// Its latest committed checkpoint: uri, iteration, `time_attr`.
    checkpoint: Option<(String, u64, f64)>,
}

/// Population-based training. See the module docs.
pub struct Pbt {
    obj: Objective,
    interval: f64,
    burn_in: f64,
    quantile_fraction: f64,
    resample_probability: f64,
    factors: Vec<f64>,
    mutations: Vec<(Vec<String>, Mutation)>,
    custom: Option<CustomExplore>,
    seed: u64,
    /// Perturbations decided so far: seeds the next one's draws.
    perturbations: u64,
    added: u64,
    members: BTreeMap<String, Member>,
    exploits: Vec<Exploit>,
}

impl Pbt {
    /// A PBT scheduler; `mutations` maps dotted config paths (`optim.lr`) to
    /// what each may become. The settings are checked by
    /// [`crate::PbtConfig`]; here they are taken as given.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        obj: Objective,
        perturbation_interval: f64,
        burn_in_period: f64,
        quantile_fraction: f64,
        resample_probability: f64,
        perturbation_factors: Vec<f64>,
        mutations: Vec<(String, Mutation)>,
        custom: Option<CustomExplore>,
        seed: u64,
    ) -> Self {
        Self {
            obj,
            interval: perturbation_interval,
            burn_in: burn_in_period,
            quantile_fraction,
            resample_probability,
            factors: perturbation_factors,
            mutations: mutations.into_iter().map(|(k, m)| (k.split('.').map(str::to_string).collect(), m)).collect(),
            custom,
            seed,
            perturbations: 0,
            added: 0,
            members: BTreeMap::new(),
            exploits: Vec::new(),
        }
    }

    fn member(&mut self, trial: &TrialView<'_>) -> &mut Member {
        let order = &mut self.added;
        self.members.entry(trial.id.to_string()).or_insert_with(|| {
            *order += 1;
            Member { order: *order, config: trial.config.clone(), score: None, last_perturbation: 0.0, checkpoint: None }
        })
    }

    /// The bottom and top quantiles of the live trials with a score, worst
    /// first and best last (Ray's rule: `ceil(n * fraction)` each, at most
    /// half; none with fewer than two trials).
    fn quantiles(&self) -> (Vec<&str>, Vec<&str>) {
        let mut ranked: Vec<(&str, &Member)> =
            self.members.iter().filter(|(_, m)| m.score.is_some()).map(|(k, m)| (k.as_str(), m)).collect();
        if ranked.len() <= 1 {
            return (Vec::new(), Vec::new());
        }
        // Ascending score; on a tie the later trial ranks lower.
        let key = |m: &Member| m.score.map_or(f64::NEG_INFINITY, Score::value);
        ranked.sort_by(|a, b| key(a.1).total_cmp(&key(b.1)).then(b.1.order.cmp(&a.1.order)));
        let n = ranked.len();
        let mut k = (n as f64 * self.quantile_fraction).ceil() as usize;
        if k as f64 > n as f64 / 2.0 {
            k = n / 2;
        }
        let ids: Vec<&str> = ranked.iter().map(|(id, _)| *id).collect();
        (ids[..k].to_vec(), ids[n - k..].to_vec())
    }

    /// The donor's config, explored (see the module docs).
    pub fn explore(&self, config: &Config, rng: &mut dyn RngCore) -> Config {
        let mut out = config.clone();
        for (path, mutation) in &self.mutations {
            let current = get(&out, path).cloned().unwrap_or(Value::Null);
            let resample = rng.random::<f64>() < self.resample_probability || !mutation.contains(&current);
            let new = match mutation {
                Mutation::Values(values) | Mutation::Domain(Domain::Choice(values) | Domain::Grid(values)) => {
                    if values.is_empty() {
                        continue;
                    }
                    match values.iter().position(|v| v == &current).filter(|_| !resample) {
                        Some(i) => {
                            let j = if rng.random::<bool>() { i + 1 } else { i.saturating_sub(1) };
                            values[j.min(values.len() - 1)].clone()
                        }
                        None => values[rng.random_range(0..values.len())].clone(),
                    }
                }
                Mutation::Domain(d) => {
                    let perturbed = current.as_f64().filter(|_| !resample && !self.factors.is_empty()).and_then(|x| {
                        let f = self.factors[rng.random_range(0..self.factors.len())];
                        d.nearest(x * f)
                    });
                    perturbed.unwrap_or_else(|| d.sample(rng))
                }
            };
            set(&mut out, path, new);
        }
        if let Some(custom) = &self.custom {
            (custom.0)(&mut out, rng);
        }
        out
    }
}

fn get<'a>(config: &'a Config, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(config, |v, k| v.get(k))
}

fn set(config: &mut Config, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut node = config;
    for k in parents {
        if !node.is_object() {
            *node = json!({});
        }
        let Some(obj) = node.as_object_mut() else { return };
        node = obj.entry(k.clone()).or_insert_with(|| json!({}));
    }
    if !node.is_object() {
        *node = json!({});
    }
    if let Some(obj) = node.as_object_mut() {
        obj.insert(last.clone(), value);
    }
}

impl Scheduler for Pbt {
    fn on_trial_add(&mut self, trial: &TrialView<'_>) {
        self.member(trial);
    }

    fn on_trial_result(&mut self, trial: &TrialView<'_>, result: &TrialResult) -> Decision {
        let Some((time, score)) = self.obj.read(result) else { return Decision::Continue };
        let (interval, burn_in) = (self.interval, self.burn_in);
        let m = self.member(trial);
        m.config = trial.config.clone();
        m.score = Some(score);
        if let Some(uri) = &result.checkpoint {
            m.checkpoint = Some((uri.clone(), result.training_iteration, time));
        }
        if time < burn_in || time - m.last_perturbation < interval {
            return Decision::Continue;
        }
        m.last_perturbation = time;
        let (lower, upper) = self.quantiles();
        if !lower.contains(&trial.id) {
            return Decision::Continue;
        }
        // Only a trial with a committed checkpoint can give its state away.
        let donors: Vec<String> =
            upper.into_iter().filter(|d| *d != trial.id && self.members[*d].checkpoint.is_some()).map(str::to_string).collect();
        if donors.is_empty() {
            return Decision::Continue;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ self.perturbations.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        self.perturbations += 1;
        let donor = donors[rng.random_range(0..donors.len())].clone();
        let d = &self.members[&donor];
        let Some((uri, iteration, at)) = d.checkpoint.clone() else { return Decision::Continue };
        let config = self.explore(&d.config, &mut rng);
        let m = self.member(trial);
        // Not ranked, nor a donor, until it reports from its new state.
        m.config = config.clone();
        m.score = None;
        m.checkpoint = None;
        m.last_perturbation = at;
        self.exploits.push(Exploit { trial_id: trial.id.to_string(), donor, checkpoint: uri, checkpoint_iteration: iteration, config });
        Decision::Pause
    }

    fn on_trial_complete(&mut self, trial: &TrialView<'_>, _result: Option<&TrialResult>) {
        self.members.remove(trial.id);
    }

    fn on_trial_error(&mut self, trial: &TrialView<'_>) {
        self.members.remove(trial.id);
    }

    fn take_exploits(&mut self) -> Vec<Exploit> {
        std::mem::take(&mut self.exploits)
    }

    fn required_metrics(&self) -> Vec<(String, String)> {
        self.obj.required()
    }

    fn save(&self) -> Value {
        json!({ "version": 1, "kind": "pbt", "members": self.members, "perturbations": self.perturbations, "added": self.added })
    }

    fn restore(&mut self, state: &Value) -> Result<(), SchedulerError> {
        if state["version"].as_u64() != Some(1) || state["kind"] != "pbt" {
            return Err(SchedulerError::State(format!("not a version-1 PBT state: {state}")));
        }
        let bad = |e: serde_json::Error| SchedulerError::State(format!("PBT state: {e}"));
        self.members = serde_json::from_value(state["members"].clone()).map_err(bad)?;
        self.perturbations = state["perturbations"].as_u64().unwrap_or(0);
        self.added = state["added"].as_u64().unwrap_or(self.members.len() as u64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use search::Mode;

    fn pbt(mutations: Vec<(&str, Mutation)>) -> Pbt {
        Pbt::new(
            Objective::new("loss", Mode::Min),
            2.0,
            0.0,
            0.25,
            0.0,
            vec![1.2, 0.8],
            mutations.into_iter().map(|(k, m)| (k.to_string(), m)).collect(),
            None,
            7,
        )
    }

    #[test]
    fn a_list_value_moves_to_a_neighbour_and_a_number_by_a_factor_within_its_domain() {
        let p = pbt(vec![
            ("opt.lr", Mutation::Domain(Domain::loguniform(1e-3, 1.0))),
            ("bs", Mutation::Values(vec![json!(16), json!(32), json!(64)])),
            ("layers", Mutation::Domain(Domain::randint(1, 5))),
        ]);
        let start = json!({ "opt": { "lr": 0.1 }, "bs": 32, "layers": 4, "other": "kept" });
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..200 {
            let c = p.explore(&start, &mut rng);
            let lr = c["opt"]["lr"].as_f64().unwrap_or(0.0);
            assert!((lr - 0.12).abs() < 1e-12 || (lr - 0.08).abs() < 1e-12, "{c}");
            assert!(c["bs"] == json!(16) || c["bs"] == json!(64), "{c}");
            // 4 * 1.2 = 4.8 rounds to 5, outside randint [1, 5): clamped to 4; 4 * 0.8 = 3.2 -> 3.
            assert!(c["layers"] == json!(4) || c["layers"] == json!(3), "{c}");
            assert_eq!(c["other"], "kept");
        }
        // A value the mutation cannot produce is resampled.
        let c = p.explore(&json!({ "opt": { "lr": 5.0 }, "bs": 48, "layers": 4 }), &mut rng);
        assert!(Domain::loguniform(1e-3, 1.0).contains(&c["opt"]["lr"]) && [16, 32, 64].contains(&c["bs"].as_i64().unwrap_or(0)), "{c}");
    }
}
