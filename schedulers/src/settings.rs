//! What every scheduler's settings share: the error naming a key, the
//! defaults serde fills in, and the checks more than one scheduler makes.
//! A leaf: each scheduler's file uses it, and `config.rs` gathers them.

use search::Mode;

use crate::objective::Objective;

/// A setting that breaks a rule: the key (under `scheduler.`) and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("scheduler.{key}: {message}")]
pub struct ConfigError {
    /// The key, e.g. `reduction_factor` or `hyperparam_mutations.lr`.
    pub key: String,
    /// The rule it breaks.
    pub message: String,
}

pub(crate) fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError { key: key.into(), message: message.into() }
}

pub(crate) fn training_iteration() -> String {
    "training_iteration".into()
}
pub(crate) fn one() -> f64 {
    1.0
}
pub(crate) fn hundred() -> f64 {
    100.0
}
pub(crate) fn eighty_one() -> f64 {
    81.0
}
pub(crate) fn four() -> f64 {
    4.0
}
pub(crate) fn three() -> f64 {
    3.0
}
pub(crate) fn one_usize() -> usize {
    1
}
pub(crate) fn three_usize() -> usize {
    3
}
pub(crate) fn yes() -> bool {
    true
}

pub(crate) fn objective(
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

pub(crate) fn positive(key: &'static str, v: f64) -> Result<(), ConfigError> {
    if v > 0.0 && v.is_finite() {
        Ok(())
    } else {
        Err(invalid(key, format!("must be a positive number, got {v}")))
    }
}

/// The settings PBT and PB2 share.
pub(crate) fn population(perturbation_interval: f64, burn_in_period: f64, quantile_fraction: f64) -> Result<(), ConfigError> {
    positive("perturbation_interval", perturbation_interval)?;
    if !(burn_in_period >= 0.0 && burn_in_period.is_finite()) {
        return Err(invalid("burn_in_period", format!("must be 0 or more, got {burn_in_period}")));
    }
    if !(quantile_fraction > 0.0 && quantile_fraction <= 0.5) {
        return Err(invalid("quantile_fraction", format!("must be in (0, 0.5], got {quantile_fraction}")));
    }
    Ok(())
}

/// A halving scheduler's first rung: as set, else 1 for iterations (Ray's
/// default) and, for a cost attribute, two rungs below `max_t`, at
/// `max_t / rf^2` and `max_t / rf`: on learning curves in training size or
/// compute, the early points cost almost nothing but rank poorly, and the
/// last rungs hold most of the cost.
pub(crate) fn grace(set: Option<f64>, time_attr: &str, max_t: f64, rf: f64) -> f64 {
    match set {
        Some(g) => g,
        None if time_attr == "training_iteration" => 1.0,
        None => max_t / (rf * rf),
    }
}

pub(crate) fn halving(max_t: f64, grace_period: f64, rf: f64) -> Result<(), ConfigError> {
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
