//! The settings of population-based training and of PB2 (Ray's
//! `PopulationBasedTraining` and `PB2` names and defaults), checked against
//! the search space: what each explored hyperparameter may become.

use serde::{Deserialize, Serialize};

use search::{Domain, Mode, Node, Space};

use crate::pbt::{CustomExplore, Mutation, Pbt};
use crate::settings::{invalid, objective, population, ConfigError};

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
    /// Synchronous rounds (Ray's `synch`, default false): every trial waits
    /// at each interval for the whole population, ranked together; the
    /// outcome is the same whatever the machine's load. Asynchronous: each
    /// trial is ranked when it reaches its interval, against the results in.
    #[serde(default)]
    pub synch: bool,
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
            synch: false,
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
    /// Synchronous rounds (Ray's `synch`, default false): every trial waits
    /// at each interval for the whole population, ranked together; the
    /// outcome is the same whatever the machine's load. Asynchronous: each
    /// trial is ranked when it reaches its interval, against the results in.
    #[serde(default)]
    pub synch: bool,
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
            synch: false,
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
    pub(crate) fn bounds(&self) -> Result<Vec<(String, Domain)>, ConfigError> {
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

impl PbtConfig {
    /// Checks the settings and builds PBT; `metric` and `mode` default to the experiment's.
    pub(crate) fn build(&self, default_metric: Option<&str>, default_mode: Option<Mode>) -> Result<Pbt, ConfigError> {
        let c = self;
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
        Ok(Pbt::new(
            obj,
            c.perturbation_interval,
            c.burn_in_period,
            c.quantile_fraction,
            c.resample_probability,
            c.perturbation_factors.clone(),
            mutations,
            c.custom_explore.clone(),
            c.seed.unwrap_or(0),
        )
        .synchronous(c.synch))
    }
}

impl Pb2Config {
    /// Checks the settings and builds PB2; `metric` and `mode` default to the experiment's.
    pub(crate) fn build(&self, default_metric: Option<&str>, default_mode: Option<Mode>) -> Result<Pbt, ConfigError> {
        let c = self;
        let obj = objective(&c.metric, c.mode, &c.time_attr, default_metric, default_mode)?;
        population(c.perturbation_interval, c.burn_in_period, c.quantile_fraction)?;
        let bounds = c.bounds()?;
        if bounds.is_empty() {
            return Err(invalid(
                "hyperparam_bounds",
                "required: the bounds of each explored hyperparameter, e.g. lr = { loguniform = [1e-4, 1e-1] }",
            ));
        }
        Ok(Pbt::pb2(obj, c.perturbation_interval, c.burn_in_period, c.quantile_fraction, bounds, c.seed.unwrap_or(0)).synchronous(c.synch))
    }
}
