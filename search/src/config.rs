//! The `[search]` section of an experiment: which algorithm suggests the
//! configs and with what settings, checked and turned into a [`Searcher`]
//! here, where the searchers live.

use serde::{Deserialize, Serialize};

use crate::{
    BasicVariantGenerator, Bohb, BohbOptions, ConcurrencyLimiter, Config, Mode, Repeater, SearchError, Searcher, Space, Tpe, TpeOptions,
};

/// The search algorithm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// Random search (grid axes expanded).
    #[default]
    Random,
    /// Grid search (random axes still sampled, as in Ray).
    Grid,
    /// TPE, the tree-structured Parzen estimator (needs experiment.metric and mode).
    Tpe,
    /// BOHB: TPE models per budget, with `scheduler.type = "hyperband_bohb"`.
    Bohb,
}

/// `[search]`: the algorithm and its settings. A setting left out takes
/// the algorithm's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchConfig {
    /// `random`, `grid`, `tpe` or `bohb`.
    #[serde(default)]
    pub algorithm: Algorithm,
    /// TPE: random configs before the model takes over (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_startup_trials: Option<usize>,
    /// TPE and BOHB: candidates per suggestion (default 24; BOHB 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_ei_candidates: Option<usize>,
    /// BOHB: observations a budget's model needs, beyond 2 (default: parameters + 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_points_in_model: Option<usize>,
    /// BOHB: the share of a budget's observations that fit the good model, in percent (default 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_n_percent: Option<f64>,
    /// BOHB: the share of configs drawn at random (default 1/3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub random_fraction: Option<f64>,
    /// BOHB: how much wider the good model's kernels are when drawing candidates (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_factor: Option<f64>,
    /// TPE: model the parameters jointly (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multivariate: Option<bool>,
    /// Configs (possibly partial) to run first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points_to_evaluate: Vec<toml::Table>,
    /// Cap on the searcher's live trials (a concurrency limiter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<usize>,
    /// Run each config this many times (`__trial_index__` 0, 1, ... in its
    /// config); the searcher learns the mean of the repeats. `num_samples`
    /// then counts trials, repeats included (as in Ray).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<usize>,
}

/// A `[search]` setting that is wrong: its key (within the section) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("search.{key}: {message}")]
pub struct SettingError {
    /// The key, e.g. `n_ei_candidates` (or `experiment.metric` for the one
    /// setting outside the section a searcher needs).
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl SearchConfig {
    /// Sets TPE's settings (every one of them, as given).
    pub fn set_tpe(&mut self, o: &TpeOptions) {
        self.n_startup_trials = Some(o.n_startup_trials);
        self.n_ei_candidates = Some(o.n_ei_candidates);
        self.multivariate = Some(o.multivariate);
    }

    /// Sets BOHB's settings (its budget is the scheduler's `time_attr`, not one of these).
    pub fn set_bohb(&mut self, o: &BohbOptions) {
        self.min_points_in_model = o.min_points_in_model;
        self.top_n_percent = Some(o.top_n_percent);
        self.random_fraction = Some(o.random_fraction);
        self.n_ei_candidates = Some(o.num_samples);
        self.bandwidth_factor = Some(o.bandwidth_factor);
    }

    /// TPE's settings, defaults filled in.
    pub fn tpe_options(&self) -> TpeOptions {
        let d = TpeOptions::default();
        TpeOptions {
            n_startup_trials: self.n_startup_trials.unwrap_or(d.n_startup_trials),
            n_ei_candidates: self.n_ei_candidates.unwrap_or(d.n_ei_candidates),
            multivariate: self.multivariate.unwrap_or(d.multivariate),
        }
    }

    /// BOHB's settings, defaults filled in, with `budget` (the scheduler's
    /// `time_attr`) as its budget.
    pub fn bohb_options(&self, budget: &str) -> BohbOptions {
        let d = BohbOptions::default();
        BohbOptions {
            time_attr: budget.to_string(),
            min_points_in_model: self.min_points_in_model,
            top_n_percent: self.top_n_percent.unwrap_or(d.top_n_percent),
            random_fraction: self.random_fraction.unwrap_or(d.random_fraction),
            num_samples: self.n_ei_candidates.unwrap_or(d.num_samples),
            bandwidth_factor: self.bandwidth_factor.unwrap_or(d.bandwidth_factor),
        }
    }

    /// The configs to run first, as JSON.
    pub fn points(&self) -> Vec<Config> {
        self.points_to_evaluate.iter().map(|t| crate::toml_to_json(&toml::Value::Table(t.clone()))).collect()
    }

    /// Checks the settings against the algorithm, and that the experiment
    /// has the `metric` a model-based algorithm needs.
    pub fn check(&self, metric: Option<&str>) -> Result<(), SettingError> {
        let err = |key: &str, message: String| Err(SettingError { key: key.to_string(), message });
        let settings = [
            ("n_startup_trials", self.n_startup_trials.is_some(), Algorithm::Tpe),
            ("multivariate", self.multivariate.is_some(), Algorithm::Tpe),
            ("min_points_in_model", self.min_points_in_model.is_some(), Algorithm::Bohb),
            ("top_n_percent", self.top_n_percent.is_some(), Algorithm::Bohb),
            ("random_fraction", self.random_fraction.is_some(), Algorithm::Bohb),
            ("bandwidth_factor", self.bandwidth_factor.is_some(), Algorithm::Bohb),
        ];
        for (key, set, of) in settings {
            if set && self.algorithm != of {
                let name = if of == Algorithm::Tpe { "tpe" } else { "bohb" };
                return err(key, format!("is a {} setting: set search.algorithm = \"{name}\" or remove it", name.to_uppercase()));
            }
        }
        let model = matches!(self.algorithm, Algorithm::Tpe | Algorithm::Bohb);
        if self.n_ei_candidates.is_some() && !model {
            return err("n_ei_candidates", "is a TPE and BOHB setting: set search.algorithm = \"tpe\" or remove it".into());
        }
        if model {
            let name = if self.algorithm == Algorithm::Tpe { "tpe" } else { "bohb" };
            if metric.is_none() {
                return Err(SettingError {
                    key: "experiment.metric".into(),
                    message: format!("required by search.algorithm = \"{name}\" (the metric it models)"),
                });
            }
            if self.n_ei_candidates == Some(0) {
                return err("n_ei_candidates", "must be at least 1".into());
            }
        }
        if self.algorithm == Algorithm::Bohb {
            self.bohb_options("").check().map_err(|(key, message)| SettingError { key, message })?;
        }
        if self.repeat == Some(0) {
            return err("repeat", "must be at least 1".into());
        }
        if self.max_concurrent == Some(0) {
            return err("max_concurrent", "must be at least 1".into());
        }
        Ok(())
    }

    /// The algorithm's searcher over `space`, suggesting `points` first:
    /// `num_samples` trials (repeats included), modelling `metric` in
    /// `mode`, BOHB's budget `budget`. Repeats and the concurrency limit
    /// are [`SearchConfig::around`]'s.
    #[allow(clippy::too_many_arguments)]
    pub fn searcher(
        &self,
        space: Space,
        metric: Option<&str>,
        mode: Option<Mode>,
        seed: u64,
        num_samples: u64,
        points: Vec<Config>,
        budget: &str,
    ) -> Result<Box<dyn Searcher>, SearchError> {
        let (metric, mode) = (metric.unwrap_or_default().to_string(), mode.unwrap_or_default());
        Ok(match self.algorithm {
            Algorithm::Tpe => Box::new(Tpe::new(space, metric, mode, seed, self.tpe_options()).with_points(points)?),
            Algorithm::Bohb => Box::new(Bohb::new(space, metric, mode, seed, self.bohb_options(budget)).with_points(points)?),
            Algorithm::Random | Algorithm::Grid => {
                // With repeats, num_samples counts trials (as in Ray): fewer configs.
                let configs = num_samples.div_ceil(self.repeat.unwrap_or(1).max(1) as u64);
                Box::new(BasicVariantGenerator::new(space, configs, seed).with_points(points)?)
            }
        })
    }

    /// `searcher` with this section's repeats and concurrency limit around it.
    pub fn around(&self, searcher: Box<dyn Searcher>) -> Box<dyn Searcher> {
        let searcher: Box<dyn Searcher> = match self.repeat {
            Some(n) if n > 1 => Box::new(Repeater::new(searcher, n)),
            _ => searcher,
        };
        match self.max_concurrent {
            Some(n) => Box::new(ConcurrencyLimiter::new(searcher, n)),
            None => searcher,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_survive_the_round_trip_and_a_stray_one_is_named() {
        let mut c = SearchConfig { algorithm: Algorithm::Tpe, ..Default::default() };
        let tpe = TpeOptions { n_startup_trials: 3, n_ei_candidates: 7, multivariate: true };
        c.set_tpe(&tpe);
        assert_eq!(c.tpe_options(), tpe);
        let text = toml::to_string(&c).unwrap();
        let back: SearchConfig = toml::from_str(&text).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.check(Some("loss")), Ok(()));
        assert_eq!(back.check(None).unwrap_err().key, "experiment.metric");

        let mut c = SearchConfig { algorithm: Algorithm::Bohb, ..Default::default() };
        let bohb = BohbOptions {
            min_points_in_model: Some(4),
            top_n_percent: 20.0,
            random_fraction: 0.5,
            num_samples: 9,
            bandwidth_factor: 2.0,
            ..Default::default()
        };
        c.set_bohb(&bohb);
        assert_eq!(c.bohb_options("epoch"), BohbOptions { time_attr: "epoch".into(), ..bohb });
        c.top_n_percent = Some(100.0);
        assert_eq!(c.check(Some("loss")).unwrap_err().key, "top_n_percent");

        let stray = SearchConfig { multivariate: Some(true), ..Default::default() };
        let e = stray.check(Some("loss")).unwrap_err();
        assert_eq!(e.to_string(), "search.multivariate: is a TPE setting: set search.algorithm = \"tpe\" or remove it");
        assert!(toml::from_str::<SearchConfig>("n_startup = 3").is_err(), "a misspelt key is refused");
    }
}
