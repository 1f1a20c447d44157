//! Scheduler settings (TOML `[scheduler]`, or Rust), under Ray Tune's
//! names, checked when the experiment is built: an impossible scheduler
//! cannot be made.

use serde::{Deserialize, Serialize};

use search::{Domain, Mode, Node, Space};

use crate::asha::{Asha, AshaType};
use crate::hyperband::HyperBand;
use crate::median::MedianStopping;
use crate::objective::Objective;
use crate::pbt::{CustomExplore, Mutation, Pbt};
use crate::resource_changing::{ResourceChanging, WorkerAllocation};
use crate::{Fifo, Scheduler};

/// A setting that breaks a rule: the key (under `scheduler.`) and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("scheduler.{key}: {message}")]
pub struct ConfigError {
    /// The key, e.g. `reduction_factor` or `hyperparam_mutations.lr`.
    pub key: String,
    /// The rule it breaks.
    pub message: String,
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError { key: key.into(), message: message.into() }
}

/// `[scheduler]`: `type` picks the scheduler; the other keys are its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SchedulerConfig {
    /// First in, first out; never stops a trial early.
    #[default]
    Fifo,
    /// ASHA, `asha_type = "stopping"` (default) or `"promotion"`.
    Asha(AshaConfig),
    /// Synchronous HyperBand.
    Hyperband(HyperBandConfig),
    /// HyperBand for BOHB (`[search] algorithm = "bohb"`), as Ray's
    /// `HyperBandForBOHB`: the same synchronous brackets, filled largest
    /// first, pausing trials at each milestone while a bracket fills; BOHB
    /// learns from the results at those milestones.
    HyperbandBohb(HyperBandConfig),
    /// The median stopping rule.
    MedianStopping(MedianStoppingConfig),
    /// Population-based training.
    Pbt(PbtConfig),
    /// Population-based bandits: PBT exploring by GP-UCB.
    Pb2(Pb2Config),
    /// Another scheduler, with trials' numbers of workers changed at checkpoints.
    ResourceChanging(ResourceChangingConfig),
}

fn training_iteration() -> String {
    "training_iteration".into()
}
fn one() -> f64 {
    1.0
}
fn hundred() -> f64 {
    100.0
}
fn eighty_one() -> f64 {
    81.0
}
fn four() -> f64 {
    4.0
}
fn three() -> f64 {
    3.0
}
fn one_usize() -> usize {
    1
}
fn three_usize() -> usize {
    3
}
fn yes() -> bool {
    true
}

/// ASHA's settings (Ray's `ASHAScheduler` names and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AshaConfig {
    /// `stopping` (default) or `promotion`.
    #[serde(default)]
    pub asha_type: AshaType,
    /// The metric (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// `min` or `max` (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The time attribute rungs are laid on.
    #[serde(default = "training_iteration")]
    pub time_attr: String,
    /// Trials stop at this time (default 100).
    #[serde(default = "hundred")]
    pub max_t: f64,
    /// The first rung (default 1).
    #[serde(default = "one")]
    pub grace_period: f64,
    /// Keep 1 in this many at each rung (default 4).
    #[serde(default = "four")]
    pub reduction_factor: f64,
    /// Brackets (default 1).
    #[serde(default = "one_usize")]
    pub brackets: usize,
}

impl Default for AshaConfig {
    fn default() -> Self {
        Self {
            asha_type: AshaType::Stopping,
            metric: None,
            mode: None,
            time_attr: training_iteration(),
            max_t: hundred(),
            grace_period: one(),
            reduction_factor: four(),
            brackets: 1,
        }
    }
}

/// HyperBand's settings (Ray's `HyperBandScheduler` names and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HyperBandConfig {
    /// The metric (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// `min` or `max` (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The time attribute rungs are laid on.
    #[serde(default = "training_iteration")]
    pub time_attr: String,
    /// The longest a trial runs (default 81).
    #[serde(default = "eighty_one")]
    pub max_t: f64,
    /// The least a trial runs (default 1).
    #[serde(default = "one")]
    pub grace_period: f64,
    /// Keep 1 in this many at each halving (default 3).
    #[serde(default = "three")]
    pub reduction_factor: f64,
}

impl Default for HyperBandConfig {
    fn default() -> Self {
        Self {
            metric: None,
            mode: None,
            time_attr: training_iteration(),
            max_t: eighty_one(),
            grace_period: one(),
            reduction_factor: three(),
        }
    }
}

/// The median stopping rule's settings (Ray's `MedianStoppingRule` names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MedianStoppingConfig {
    /// The metric (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// `min` or `max` (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The time attribute.
    #[serde(default = "training_iteration")]
    pub time_attr: String,
    /// No trial is judged before this time (default 1).
    #[serde(default = "one")]
    pub grace_period: f64,
    /// Other trials needed to judge one (default 3).
    #[serde(default = "three_usize")]
    pub min_samples_required: usize,
    /// Stop (default) or, when false, pause a trial below the median.
    #[serde(default = "yes")]
    pub hard_stop: bool,
}

impl Default for MedianStoppingConfig {
    fn default() -> Self {
        Self {
            metric: None,
            mode: None,
            time_attr: training_iteration(),
            grace_period: one(),
            min_samples_required: three_usize(),
            hard_stop: true,
        }
    }
}

fn time_total_s() -> String {
    "time_total_s".into()
}
fn sixty() -> f64 {
    60.0
}
fn quarter() -> f64 {
    0.25
}
fn factors() -> Vec<f64> {
    vec![1.2, 0.8]
}

/// Population-based training's settings (Ray's `PopulationBasedTraining`
/// names and defaults).
///
/// In TOML, each mutation is a domain or a list of values:
///
/// ```toml
/// [scheduler]
/// type = "pbt"
/// time_attr = "training_iteration"
/// perturbation_interval = 4
///
/// [scheduler.hyperparam_mutations]
/// lr = { loguniform = [1e-4, 1e-1] }
/// batch_size = [16, 32, 64]
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PbtConfig {
    /// The metric (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// `min` or `max` (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The time attribute intervals are measured in (default `time_total_s`, as Ray).
    #[serde(default = "time_total_s")]
    pub time_attr: String,
    /// A trial is ranked, and may exploit another, every this much time (default 60).
    #[serde(default = "sixty")]
    pub perturbation_interval: f64,
    /// No perturbation before this time (default 0).
    #[serde(default)]
    pub burn_in_period: f64,
    /// The fraction of trials in the top and in the bottom quantile, in (0, 0.5] (default 0.25).
    #[serde(default = "quarter")]
    pub quantile_fraction: f64,
    /// The chance that an explored value is drawn afresh instead of perturbed (default 0.25).
    #[serde(default = "quarter")]
    pub resample_probability: f64,
    /// What a numeric value is multiplied by when perturbed, one at random (default [1.2, 0.8]).
    #[serde(default = "factors")]
    pub perturbation_factors: Vec<f64>,
    /// What each hyperparameter may become: a domain or a list of values, by
    /// (dotted) config path. Every key must be a parameter of the search space.
    #[serde(default)]
    pub hyperparam_mutations: toml::Table,
    /// Seeds the exploit and explore draws (default: the experiment's seed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Runs after the built-in explore step (Rust only).
    #[serde(skip)]
    pub custom_explore: Option<CustomExplore>,
}

impl Default for PbtConfig {
    fn default() -> Self {
        Self {
            metric: None,
            mode: None,
            time_attr: time_total_s(),
            perturbation_interval: sixty(),
            burn_in_period: 0.0,
            quantile_fraction: quarter(),
            resample_probability: quarter(),
            perturbation_factors: factors(),
            hyperparam_mutations: toml::Table::new(),
            seed: None,
            custom_explore: None,
        }
    }
}

impl PbtConfig {
    /// Lets `key` (a dotted config path) be explored within `domain`.
    pub fn mutate(mut self, key: &str, domain: Domain) -> Self {
        if let Ok(space) = Space::builder().param("m", domain).build() {
            if let Some(v) = space.to_toml().remove("m") {
                insert_path(&mut self.hyperparam_mutations, key, v);
            }
        }
        self
    }

    /// Lets `key` be explored among `values` (perturbed to a neighbour).
    pub fn mutate_among<I, V>(mut self, key: &str, values: I) -> Self
    where
        I: IntoIterator<Item = V>,
        V: Into<serde_json::Value>,
    {
        let list = values.into_iter().map(|v| search::json_to_toml(&v.into())).collect();
        insert_path(&mut self.hyperparam_mutations, key, toml::Value::Array(list));
        self
    }

    /// Runs `f` on every explored config, after the built-in step.
    pub fn custom_explore<F>(mut self, f: F) -> Self
    where
        F: Fn(&mut search::Config, &mut dyn rand::RngCore) + Send + Sync + 'static,
    {
        self.custom_explore = Some(CustomExplore::new(f));
        self
    }

    /// The mutations by dotted path, checked.
    fn mutations(&self) -> Result<Vec<(String, Mutation)>, ConfigError> {
        let space =
            Space::from_toml(&self.hyperparam_mutations).map_err(|e| invalid(format!("hyperparam_mutations.{}", e.path), e.message))?;
        let mut out = Vec::new();
        collect_mutations(&space, "", &mut out)?;
        Ok(out)
    }

    /// Checks each mutation against the search space: its key must be a
    /// parameter there, and what it can produce must lie in that parameter's domain.
    pub fn check_space(&self, space: &Space) -> Result<(), ConfigError> {
        check_mutations("hyperparam_mutations", self.mutations()?, space)
    }
}

/// Checks what `field`'s mutations can produce against the search space:
/// each key must be a parameter there, and its values must lie in that
/// parameter's domain.
fn check_mutations(field: &str, mutations: Vec<(String, Mutation)>, space: &Space) -> Result<(), ConfigError> {
    for (path, mutation) in mutations {
        let key = format!("{field}.{path}");
        let Some(node) = find(space, &path) else {
            return Err(invalid(key, format!("`{path}` is not a parameter of [space]; add it there (trials start from its values)")));
        };
        let Node::Domain(d) = node else {
            return Err(invalid(key, format!("`{path}` is a nested table in [space], not a parameter")));
        };
        let outside = |what: String| invalid(key.clone(), format!("{what} is outside [space] {path} = {}", d.describe()));
        match (&mutation, d) {
            (_, Domain::Const(_)) => {}
            (Mutation::Values(values), _) => {
                if let Some(v) = values.iter().find(|v| !d.contains(v)) {
                    return Err(outside(format!("the value {v}")));
                }
            }
            // A numeric grid or choice gives the starting values: the mutation must be able to produce them.
            (Mutation::Domain(m), Domain::Choice(values) | Domain::Grid(values)) => {
                if let Some(v) = values.iter().find(|v| m.nearest(v.as_f64().unwrap_or(f64::NAN)).as_ref() != Some(*v)) {
                    return Err(invalid(key, format!("{} cannot produce [space] {path}'s value {v}", m.describe())));
                }
            }
            (Mutation::Domain(m), _) => {
                if let Some((low, high, int)) = d.bounds() {
                    let fits = m.bounds().is_some_and(|(ml, mh, mint)| ml >= low && mh <= high && (mint || !int));
                    if !fits {
                        return Err(outside(m.describe()));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The resource-changing wrapper's settings (Ray's
/// `ResourceChangingScheduler`): the scheduler it wraps and how free
/// workers are shared out.
///
/// ```toml
/// [scheduler]
/// type = "resource_changing"
/// allocation = "distribute"   # or "top_job"
/// max_workers = 4
///
/// [scheduler.base]
/// type = "asha"
/// max_t = 40
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceChangingConfig {
    /// The scheduler that decides which trials go on (default FIFO).
    #[serde(default)]
    pub base: Box<SchedulerConfig>,
    /// `distribute` (an even share for every running trial, the default) or
    /// `top_job` (the free workers to the best trial).
    #[serde(default)]
    pub allocation: WorkerAllocation,
    /// The most workers a trial gets (default: all the node holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_workers: Option<u32>,
    /// The metric `top_job` ranks by (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// `min` or `max` (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
}

impl Default for ResourceChangingConfig {
    fn default() -> Self {
        Self { base: Box::new(SchedulerConfig::Fifo), allocation: WorkerAllocation::default(), max_workers: None, metric: None, mode: None }
    }
}

/// PB2's settings (Ray's `PB2` names and defaults): PBT's ranking, with
/// the explored values chosen by a Gaussian-process bandit.
///
/// Each bound is `[low, high]` (integers: an integer range, both ends
/// included; floats: uniform) or a bounded numeric domain, on whose scale
/// it is explored:
///
/// ```toml
/// [scheduler]
/// type = "pb2"
/// time_attr = "training_iteration"
/// perturbation_interval = 4
///
/// [scheduler.hyperparam_bounds]
/// lr = { loguniform = [1e-4, 1e-1] }
/// momentum = [0.8, 0.99]
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pb2Config {
    /// The metric (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// `min` or `max` (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The time attribute intervals are measured in (default `time_total_s`, as Ray).
    #[serde(default = "time_total_s")]
    pub time_attr: String,
    /// A trial is ranked, and may exploit another, every this much time (default 60).
    #[serde(default = "sixty")]
    pub perturbation_interval: f64,
    /// No perturbation before this time (default 0).
    #[serde(default)]
    pub burn_in_period: f64,
    /// The fraction of trials in the top and in the bottom quantile, in (0, 0.5] (default 0.25).
    #[serde(default = "quarter")]
    pub quantile_fraction: f64,
    /// The explored hyperparameters' bounds, by (dotted) config path.
    #[serde(default)]
    pub hyperparam_bounds: toml::Table,
    /// Seeds the exploit and explore draws (default: the experiment's seed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl Default for Pb2Config {
    fn default() -> Self {
        Self {
            metric: None,
            mode: None,
            time_attr: time_total_s(),
            perturbation_interval: sixty(),
            burn_in_period: 0.0,
            quantile_fraction: quarter(),
            hyperparam_bounds: toml::Table::new(),
            seed: None,
        }
    }
}

impl Pb2Config {
    /// Lets `key` (a dotted config path) be explored within `domain` (a
    /// bounded numeric domain).
    pub fn bound(mut self, key: &str, domain: Domain) -> Self {
        if let Ok(space) = Space::builder().param("m", domain).build() {
            if let Some(v) = space.to_toml().remove("m") {
                insert_path(&mut self.hyperparam_bounds, key, v);
            }
        }
        self
    }

    /// The bounds by dotted path, checked: `[low, high]` pairs become domains.
    fn bounds(&self) -> Result<Vec<(String, Domain)>, ConfigError> {
        let table = pairs_to_domains(&self.hyperparam_bounds, "")?;
        let space = Space::from_toml(&table).map_err(|e| invalid(format!("hyperparam_bounds.{}", e.path), e.message))?;
        let mut found = Vec::new();
        collect_mutations(&space, "", &mut found)
            .map_err(|e| ConfigError { key: e.key.replacen("hyperparam_mutations", "hyperparam_bounds", 1), ..e })?;
        found
            .into_iter()
            .map(|(path, m)| match m {
                Mutation::Domain(d) if d.bounds().is_some() => Ok((path, d)),
                Mutation::Domain(d) => Err(invalid(
                    format!("hyperparam_bounds.{path}"),
                    format!("{} has no bounds: PB2 explores bounded numbers", d.describe()),
                )),
                Mutation::Values(_) => Err(invalid(
                    format!("hyperparam_bounds.{path}"),
                    "PB2 explores bounded numbers: give [low, high] or a numeric domain (a list of values needs type = \"pbt\")",
                )),
            })
            .collect()
    }

    /// Checks each bound against the search space, as PBT's mutations are.
    pub fn check_space(&self, space: &Space) -> Result<(), ConfigError> {
        let bounds = self.bounds()?.into_iter().map(|(k, d)| (k, Mutation::Domain(d))).collect();
        check_mutations("hyperparam_bounds", bounds, space)
    }
}

/// `hyperparam_bounds` with each `[low, high]` pair written as a domain:
/// integers as `randint` (both ends included), floats as `uniform`.
fn pairs_to_domains(table: &toml::Table, prefix: &str) -> Result<toml::Table, ConfigError> {
    let num = |v: &toml::Value| v.as_float().or(v.as_integer().map(|i| i as f64));
    let mut out = toml::Table::new();
    for (k, v) in table {
        let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        let key = format!("hyperparam_bounds.{path}");
        let v = match v {
            toml::Value::Array(pair) => {
                let (kind, low, high) = match pair.as_slice() {
                    [toml::Value::Integer(lo), toml::Value::Integer(hi)] if lo < hi => ("randint", (*lo).into(), (*hi + 1).into()),
                    [lo, hi] if num(lo).zip(num(hi)).is_some_and(|(l, h)| l < h) => {
                        ("uniform", num(lo).unwrap_or_default().into(), num(hi).unwrap_or_default().into())
                    }
                    _ => {
                        return Err(invalid(
                            key,
                            format!(
                            "expected [low, high] with low < high, or a numeric domain such as {{ loguniform = [1e-4, 1e-1] }}; got {v}"
                        ),
                        ))
                    }
                };
                let mut domain = toml::Table::new();
                domain.insert(kind.into(), toml::Value::Array(vec![low, high]));
                toml::Value::Table(domain)
            }
            // A nested table of bounds (a domain's table is left to the space parser).
            toml::Value::Table(t) if !t.keys().any(|k| search::DOMAIN_KINDS.contains(&k.as_str())) => {
                toml::Value::Table(pairs_to_domains(t, &path)?)
            }
            other => other.clone(),
        };
        out.insert(k.clone(), v);
    }
    Ok(out)
}

fn insert_path(table: &mut toml::Table, key: &str, value: toml::Value) {
    match key.split_once('.') {
        None => {
            table.insert(key.to_string(), value);
        }
        Some((head, rest)) => {
            let entry = table.entry(head.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            if let toml::Value::Table(t) = entry {
                insert_path(t, rest, value);
            }
        }
    }
}

fn collect_mutations(space: &Space, prefix: &str, out: &mut Vec<(String, Mutation)>) -> Result<(), ConfigError> {
    for (name, node) in space.entries() {
        let path = if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
        match node {
            Node::Nested(s) => collect_mutations(s, &path, out)?,
            Node::Domain(Domain::Const(serde_json::Value::Array(values))) | Node::Domain(Domain::Choice(values) | Domain::Grid(values)) => {
                if values.is_empty() {
                    return Err(invalid(format!("hyperparam_mutations.{path}"), "the list of values is empty"));
                }
                out.push((path, Mutation::Values(values.clone())));
            }
            Node::Domain(Domain::Const(v)) => {
                return Err(invalid(
                    format!("hyperparam_mutations.{path}"),
                    format!("must be a domain (e.g. {{ loguniform = [1e-4, 1e-1] }}) or a list of values, got {v}"),
                ));
            }
            Node::Domain(d) => out.push((path, Mutation::Domain(d.clone()))),
        }
    }
    Ok(())
}

fn find<'a>(space: &'a Space, path: &str) -> Option<&'a Node> {
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    let node = space.entries().find(|(name, _)| *name == head).map(|(_, n)| n)?;
    match (node, rest) {
        (_, None) => Some(node),
        (Node::Nested(s), Some(r)) => find(s, r),
        _ => None,
    }
}

fn objective(
    metric: &Option<String>,
    mode: Option<Mode>,
    time_attr: &str,
    default_metric: Option<&str>,
    default_mode: Option<Mode>,
) -> Result<Objective, ConfigError> {
    let metric = metric.as_deref().or(default_metric).ok_or_else(|| invalid("metric", "required (or set experiment.metric)"))?;
    let mode = mode.or(default_mode).ok_or_else(|| invalid("mode", "required, \"min\" or \"max\" (or set experiment.mode)"))?;
    if metric.is_empty() {
        return Err(invalid("metric", "must name a metric"));
    }
    if time_attr.is_empty() {
        return Err(invalid("time_attr", "must name a metric that grows with training (e.g. training_iteration)"));
    }
    Ok(Objective { metric: metric.to_string(), mode, time_attr: time_attr.to_string() })
}

fn positive(key: &'static str, v: f64) -> Result<(), ConfigError> {
    if v > 0.0 && v.is_finite() {
        Ok(())
    } else {
        Err(invalid(key, format!("must be a positive number, got {v}")))
    }
}

/// The settings PBT and PB2 share.
fn population(perturbation_interval: f64, burn_in_period: f64, quantile_fraction: f64) -> Result<(), ConfigError> {
    positive("perturbation_interval", perturbation_interval)?;
    if !(burn_in_period >= 0.0 && burn_in_period.is_finite()) {
        return Err(invalid("burn_in_period", format!("must be 0 or more, got {burn_in_period}")));
    }
    if !(quantile_fraction > 0.0 && quantile_fraction <= 0.5) {
        return Err(invalid("quantile_fraction", format!("must be in (0, 0.5], got {quantile_fraction}")));
    }
    Ok(())
}

fn halving(max_t: f64, grace_period: f64, rf: f64) -> Result<(), ConfigError> {
    positive("max_t", max_t)?;
    positive("grace_period", grace_period)?;
    if !(rf > 1.0 && rf.is_finite()) {
        return Err(invalid("reduction_factor", format!("must be greater than 1, got {rf}")));
    }
    if grace_period > max_t {
        return Err(invalid("grace_period", format!("{grace_period} is greater than max_t = {max_t}")));
    }
    Ok(())
}

impl SchedulerConfig {
    /// The `type` name.
    pub fn name(&self) -> &'static str {
        match self {
            SchedulerConfig::Fifo => "fifo",
            SchedulerConfig::Asha(_) => "asha",
            SchedulerConfig::Hyperband(_) => "hyperband",
            SchedulerConfig::HyperbandBohb(_) => "hyperband_bohb",
            SchedulerConfig::MedianStopping(_) => "median_stopping",
            SchedulerConfig::Pbt(_) => "pbt",
            SchedulerConfig::Pb2(_) => "pb2",
            SchedulerConfig::ResourceChanging(_) => "resource_changing",
        }
    }

    /// Whether the scheduler pauses trials (and so resumes them from checkpoints).
    pub fn pauses_trials(&self) -> bool {
        match self {
            SchedulerConfig::Fifo => false,
            SchedulerConfig::Asha(a) => a.asha_type == AshaType::Promotion,
            SchedulerConfig::Hyperband(_) | SchedulerConfig::HyperbandBohb(_) => true,
            SchedulerConfig::MedianStopping(m) => !m.hard_stop,
            SchedulerConfig::Pbt(_) | SchedulerConfig::Pb2(_) | SchedulerConfig::ResourceChanging(_) => true,
        }
    }

    /// Checks the settings against the search space (PBT's mutations must
    /// name its parameters and stay inside their domains).
    pub fn check_space(&self, space: &Space) -> Result<(), ConfigError> {
        match self {
            SchedulerConfig::Pbt(c) => c.check_space(space),
            SchedulerConfig::Pb2(c) => c.check_space(space),
            SchedulerConfig::ResourceChanging(c) => c.base.check_space(space),
            _ => Ok(()),
        }
    }

    /// Fills in a seed the settings leave to the experiment.
    pub fn with_default_seed(mut self, seed: Option<u64>) -> Self {
        match &mut self {
            SchedulerConfig::Pbt(c) => c.seed = c.seed.or(seed),
            SchedulerConfig::Pb2(c) => c.seed = c.seed.or(seed),
            SchedulerConfig::ResourceChanging(c) => *c.base = c.base.as_ref().clone().with_default_seed(seed),
            _ => {}
        }
        self
    }

    /// Checks the settings and builds the scheduler; `metric` and `mode`
    /// default to the experiment's.
    pub fn build(&self, default_metric: Option<&str>, default_mode: Option<Mode>) -> Result<Box<dyn Scheduler>, ConfigError> {
        Ok(match self {
            SchedulerConfig::Fifo => Box::new(Fifo),
            SchedulerConfig::Asha(c) => {
                let obj = objective(&c.metric, c.mode, &c.time_attr, default_metric, default_mode)?;
                halving(c.max_t, c.grace_period, c.reduction_factor)?;
                if c.brackets == 0 {
                    return Err(invalid("brackets", "must be at least 1"));
                }
                let asha = Asha::new(obj, c.asha_type, c.max_t, c.grace_period, c.reduction_factor, c.brackets);
                if let Some(s) = asha.milestones().iter().position(Vec::is_empty) {
                    return Err(invalid(
                        "brackets",
                        format!(
                            "bracket {s} would have no rung: grace_period * reduction_factor^{s} = {} is not below max_t = {}",
                            c.grace_period * c.reduction_factor.powi(s as i32),
                            c.max_t
                        ),
                    ));
                }
                Box::new(asha)
            }
            SchedulerConfig::Hyperband(c) | SchedulerConfig::HyperbandBohb(c) => {
                let obj = objective(&c.metric, c.mode, &c.time_attr, default_metric, default_mode)?;
                halving(c.max_t, c.grace_period, c.reduction_factor)?;
                Box::new(HyperBand::new(obj, c.max_t, c.grace_period, c.reduction_factor))
            }
            SchedulerConfig::MedianStopping(c) => {
                let obj = objective(&c.metric, c.mode, &c.time_attr, default_metric, default_mode)?;
                if !(c.grace_period >= 0.0 && c.grace_period.is_finite()) {
                    return Err(invalid("grace_period", format!("must be 0 or more, got {}", c.grace_period)));
                }
                if c.min_samples_required == 0 {
                    return Err(invalid("min_samples_required", "must be at least 1"));
                }
                Box::new(MedianStopping::new(obj, c.grace_period, c.min_samples_required, c.hard_stop))
            }
            SchedulerConfig::ResourceChanging(c) => {
                if let SchedulerConfig::ResourceChanging(_) = c.base.as_ref() {
                    return Err(invalid("base.type", "resource_changing cannot wrap itself"));
                }
                let base = c.base.build(default_metric, default_mode).map_err(|e| ConfigError { key: format!("base.{}", e.key), ..e })?;
                if c.max_workers == Some(0) {
                    return Err(invalid("max_workers", "must be at least 1"));
                }
                let needs_metric = c.allocation == WorkerAllocation::TopJob;
                let obj = match objective(&c.metric, c.mode, "training_iteration", default_metric, default_mode) {
                    Ok(obj) => obj,
                    Err(e) if needs_metric => return Err(e),
                    Err(_) => Objective::new(c.metric.clone().or(default_metric.map(str::to_string)).unwrap_or_default(), Mode::Min),
                };
                Box::new(ResourceChanging::new(base, obj, c.allocation, c.max_workers))
            }
            SchedulerConfig::Pb2(c) => {
                let obj = objective(&c.metric, c.mode, &c.time_attr, default_metric, default_mode)?;
                population(c.perturbation_interval, c.burn_in_period, c.quantile_fraction)?;
                let bounds = c.bounds()?;
                if bounds.is_empty() {
                    return Err(invalid(
                        "hyperparam_bounds",
                        "required: the bounds of each explored hyperparameter, e.g. lr = { loguniform = [1e-4, 1e-1] }",
                    ));
                }
                Box::new(Pbt::pb2(obj, c.perturbation_interval, c.burn_in_period, c.quantile_fraction, bounds, c.seed.unwrap_or(0)))
            }
            SchedulerConfig::Pbt(c) => {
                let obj = objective(&c.metric, c.mode, &c.time_attr, default_metric, default_mode)?;
                population(c.perturbation_interval, c.burn_in_period, c.quantile_fraction)?;
                if !(0.0..=1.0).contains(&c.resample_probability) {
                    return Err(invalid("resample_probability", format!("must be in [0, 1], got {}", c.resample_probability)));
                }
                if c.perturbation_factors.is_empty() || c.perturbation_factors.iter().any(|f| !(*f > 0.0 && f.is_finite())) {
                    return Err(invalid(
                        "perturbation_factors",
                        format!("must be positive numbers, e.g. [1.2, 0.8]; got {:?}", c.perturbation_factors),
                    ));
                }
                let mutations = c.mutations()?;
                if mutations.is_empty() && c.custom_explore.is_none() {
                    return Err(invalid(
                        "hyperparam_mutations",
                        "required: what each explored hyperparameter may become, e.g. lr = { loguniform = [1e-4, 1e-1] }",
                    ));
                }
                Box::new(Pbt::new(
                    obj,
                    c.perturbation_interval,
                    c.burn_in_period,
                    c.quantile_fraction,
                    c.resample_probability,
                    c.perturbation_factors.clone(),
                    mutations,
                    c.custom_explore.clone(),
                    c.seed.unwrap_or(0),
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SchedulerConfig, String> {
        toml::from_str::<SchedulerConfig>(text).map_err(|e| e.to_string())
    }

    #[test]
    fn toml_forms_and_defaults() {
        assert_eq!(parse("type = \"fifo\"").unwrap(), SchedulerConfig::Fifo);
        let SchedulerConfig::Asha(a) = parse("type = \"asha\"\nasha_type = \"promotion\"\nmax_t = 27\nreduction_factor = 3").unwrap()
        else {
            panic!("not asha")
        };
        assert_eq!((a.asha_type, a.max_t, a.grace_period, a.reduction_factor, a.brackets), (AshaType::Promotion, 27.0, 1.0, 3.0, 1));
        let err = parse("type = \"asha\"\nbracket = 2").unwrap_err();
        assert!(err.contains("unknown field `bracket`"), "{err}");
        let err = parse("type = \"asha\"\nasha_type = \"eager\"").unwrap_err();
        assert!(err.contains("eager"), "{err}");
        assert!(parse("type = \"pbx\"").unwrap_err().contains("pbx"));
    }

    #[test]
    fn impossible_settings_name_their_key() {
        let asha = |f: &dyn Fn(&mut AshaConfig)| {
            let mut c = AshaConfig::default();
            f(&mut c);
            SchedulerConfig::Asha(c).build(Some("loss"), Some(Mode::Min)).err().map(|e| e.to_string())
        };
        assert_eq!(asha(&|_| {}), None);
        assert!(asha(&|c| c.reduction_factor = 1.0).unwrap().starts_with("scheduler.reduction_factor: must be greater than 1"));
        assert!(asha(&|c| c.reduction_factor = 0.5).unwrap().starts_with("scheduler.reduction_factor"));
        assert!(asha(&|c| c.grace_period = 200.0).unwrap().starts_with("scheduler.grace_period: 200 is greater than max_t = 100"));
        assert!(asha(&|c| c.max_t = -1.0).unwrap().starts_with("scheduler.max_t"));
        assert!(asha(&|c| c.brackets = 0).unwrap().starts_with("scheduler.brackets"));
        assert!(asha(&|c| {
            c.max_t = 9.0;
            c.reduction_factor = 3.0;
            c.brackets = 3
        })
        .unwrap()
        .starts_with("scheduler.brackets: bracket 2 would have no rung"));
        let no_mode = SchedulerConfig::Hyperband(HyperBandConfig::default()).build(Some("loss"), None).err().map(|e| e.to_string());
        assert!(no_mode.unwrap().starts_with("scheduler.mode: required"));
        let no_metric = SchedulerConfig::MedianStopping(MedianStoppingConfig::default()).build(None, Some(Mode::Max)).err();
        assert_eq!(no_metric.map(|e| e.key).as_deref(), Some("metric"));
        assert!(SchedulerConfig::Fifo.build(None, None).is_ok());
    }

    #[test]
    fn pbt_settings_are_checked_naming_the_field() {
        let space = Space::from_toml_str(
            "lr = { loguniform = [1e-4, 1e-1] }\nbs = { choice = [16, 32, 64] }\nlayers = { randint = [1, 8] }\nmomentum = 0.9",
        )
        .unwrap();
        let check = |text: &str| -> Result<(), String> {
            let c = parse(&format!("type = \"pbt\"\n{text}"))?;
            c.build(Some("loss"), Some(Mode::Min)).map_err(|e| e.to_string())?;
            c.check_space(&space).map_err(|e| e.to_string())
        };
        let ok = "[hyperparam_mutations]\nlr = { loguniform = [1e-3, 1e-2] }\nbs = [16, 64]\nlayers = { randint = [2, 5] }\nmomentum = [0.8, 0.99]";
        assert_eq!(check(ok), Ok(()));
        let SchedulerConfig::Pbt(c) = parse("type = \"pbt\"").unwrap() else { panic!("not pbt") };
        assert_eq!(
            (c.time_attr.as_str(), c.perturbation_interval, c.quantile_fraction, c.resample_probability),
            ("time_total_s", 60.0, 0.25, 0.25)
        );
        let err = |text: &str| check(text).unwrap_err();
        assert!(err("").starts_with("scheduler.hyperparam_mutations: required"), "{}", err(""));
        for q in ["0", "0.6", "-0.1"] {
            let e = err(&format!("quantile_fraction = {q}\n{ok}"));
            assert!(e.starts_with("scheduler.quantile_fraction: must be in (0, 0.5]"), "{e}");
        }
        assert!(err(&format!("resample_probability = 1.5\n{ok}")).starts_with("scheduler.resample_probability"));
        assert!(err(&format!("perturbation_interval = 0\n{ok}")).starts_with("scheduler.perturbation_interval"));
        assert!(err(&format!("perturbation_factors = []\n{ok}")).starts_with("scheduler.perturbation_factors"));
        let e = err("[hyperparam_mutations]\nlr = { loguniform = [1e-5, 1] }");
        assert_eq!(e, "scheduler.hyperparam_mutations.lr: loguniform [0.00001, 1] is outside [space] lr = loguniform [0.0001, 0.1]");
        let e = err("[hyperparam_mutations]\nbs = [16, 128]");
        assert_eq!(e, "scheduler.hyperparam_mutations.bs: the value 128 is outside [space] bs = choice of 3 values");
        let e = err("[hyperparam_mutations]\nbs = { randint = [16, 64] }");
        assert_eq!(e, "scheduler.hyperparam_mutations.bs: randint [16, 64) cannot produce [space] bs's value 64");
        assert_eq!(check("[hyperparam_mutations]\nbs = { qrandint = [16, 64, 16] }"), Ok(()));
        let e = err("[hyperparam_mutations]\nlayers = { uniform = [1, 4] }");
        assert!(e.starts_with("scheduler.hyperparam_mutations.layers: uniform [1, 4) is outside"), "{e}");
        let e = err("[hyperparam_mutations]\ndropout = [0.1, 0.2]");
        assert!(e.starts_with("scheduler.hyperparam_mutations.dropout: `dropout` is not a parameter of [space]"), "{e}");
        let e = err("[hyperparam_mutations]\nlr = 0.1");
        assert!(e.starts_with("scheduler.hyperparam_mutations.lr: must be a domain"), "{e}");
        let e = err("[hyperparam_mutations]\nlr = { uniform = [1, 0] }");
        assert!(e.starts_with("scheduler.hyperparam_mutations.lr:"), "{e}");
        // The Rust builders write the same table.
        let built = PbtConfig::default().mutate("lr", Domain::loguniform(1e-3, 1e-2)).mutate_among("bs", [16, 64]);
        assert_eq!(SchedulerConfig::Pbt(built).check_space(&space), Ok(()));
    }

    #[test]
    fn pb2_bounds_are_checked_naming_the_field() {
        let space = Space::from_toml_str(
            "lr = { loguniform = [1e-4, 1e-1] }\nlayers = { randint = [1, 9] }\nmomentum = { uniform = [0.5, 1.0] }\nact = { choice = [\"relu\", \"tanh\"] }",
        )
        .unwrap();
        let check = |text: &str| -> Result<(), String> {
            let c = parse(&format!("type = \"pb2\"\n{text}"))?;
            c.build(Some("loss"), Some(Mode::Min)).map_err(|e| e.to_string())?;
            c.check_space(&space).map_err(|e| e.to_string())
        };
        // Ray's [low, high] pairs (integers: both ends included) and domains.
        let ok = "[hyperparam_bounds]\nlr = { loguniform = [1e-3, 1e-2] }\nlayers = [2, 8]\nmomentum = [0.8, 0.99]";
        assert_eq!(check(ok), Ok(()));
        let SchedulerConfig::Pb2(c) = parse(&format!("type = \"pb2\"\n{ok}")).unwrap() else { panic!("not pb2") };
        let bounds = c.bounds().unwrap();
        assert_eq!(bounds[0], ("layers".to_string(), Domain::randint(2, 9)));
        assert_eq!(bounds[2], ("momentum".to_string(), Domain::uniform(0.8, 0.99)));
        assert_eq!((c.time_attr.as_str(), c.perturbation_interval, c.quantile_fraction), ("time_total_s", 60.0, 0.25));
        let err = |text: &str| check(text).unwrap_err();
        assert!(err("").starts_with("scheduler.hyperparam_bounds: required"), "{}", err(""));
        assert!(err(&format!("quantile_fraction = 0.7\n{ok}")).starts_with("scheduler.quantile_fraction: must be in (0, 0.5]"));
        let e = err("[hyperparam_bounds]\nmomentum = [0.99, 0.8]");
        assert!(e.starts_with("scheduler.hyperparam_bounds.momentum: expected [low, high] with low < high"), "{e}");
        let e = err("[hyperparam_bounds]\nact = [\"relu\", \"tanh\"]");
        assert!(e.starts_with("scheduler.hyperparam_bounds.act: expected [low, high]"), "{e}");
        let e = err("[hyperparam_bounds]\nact = { choice = [\"relu\", \"tanh\"] }");
        assert!(e.starts_with("scheduler.hyperparam_bounds.act: PB2 explores bounded numbers"), "{e}");
        let e = err("[hyperparam_bounds]\nlr = [0.0, 0.5]");
        assert_eq!(e, "scheduler.hyperparam_bounds.lr: uniform [0, 0.5) is outside [space] lr = loguniform [0.0001, 0.1]");
        let e = err("[hyperparam_bounds]\nlayers = [0.5, 4.5]");
        assert!(e.starts_with("scheduler.hyperparam_bounds.layers: uniform [0.5, 4.5) is outside"), "{e}");
        let e = err("[hyperparam_bounds]\ndropout = [0.1, 0.2]");
        assert!(e.starts_with("scheduler.hyperparam_bounds.dropout: `dropout` is not a parameter of [space]"), "{e}");
        let built = Pb2Config::default().bound("lr", Domain::loguniform(1e-3, 1e-2));
        assert_eq!(SchedulerConfig::Pb2(built).check_space(&space), Ok(()));
    }
}
