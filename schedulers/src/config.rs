//! Scheduler settings (TOML `[scheduler]`, or Rust), under Ray Tune's
//! names, checked when the experiment is built: an impossible scheduler
//! cannot be made.

use serde::{Deserialize, Serialize};

use search::Mode;

use crate::asha::{Asha, AshaType};
use crate::hyperband::HyperBand;
use crate::median::MedianStopping;
use crate::objective::Objective;
use crate::{Fifo, Scheduler};

/// A setting that breaks a rule: the key (under `scheduler.`) and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("scheduler.{key}: {message}")]
pub struct ConfigError {
    /// The key, e.g. `reduction_factor`.
    pub key: &'static str,
    /// The rule it breaks.
    pub message: String,
}

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError { key, message: message.into() }
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
    /// The median stopping rule.
    MedianStopping(MedianStoppingConfig),
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
            SchedulerConfig::MedianStopping(_) => "median_stopping",
        }
    }

    /// Whether the scheduler pauses trials (and so resumes them from checkpoints).
    pub fn pauses_trials(&self) -> bool {
        match self {
            SchedulerConfig::Fifo => false,
            SchedulerConfig::Asha(a) => a.asha_type == AshaType::Promotion,
            SchedulerConfig::Hyperband(_) => true,
            SchedulerConfig::MedianStopping(m) => !m.hard_stop,
        }
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
            SchedulerConfig::Hyperband(c) => {
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
        assert!(parse("type = \"pbt\"").unwrap_err().contains("pbt"));
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
        assert_eq!(no_metric.map(|e| e.key), Some("metric"));
        assert!(SchedulerConfig::Fifo.build(None, None).is_ok());
    }
}
