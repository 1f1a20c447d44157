//! Scheduler settings (TOML `[scheduler]`, or Rust), under Ray Tune's
//! names, checked when the experiment is built: an impossible scheduler
//! cannot be made. `SchedulerConfig` picks the scheduler; each one's
//! settings, and their checks, live beside it (`asha.rs`, `hyperband.rs`,
//! `median.rs`, `pbt_config.rs`; what they share in `settings.rs`). The
//! resource-changing wrapper's settings are here: they hold another
//! scheduler's.

use serde::{Deserialize, Serialize};

use search::{Mode, Space};

use crate::asha::AshaConfig;
use crate::hyperband::HyperBandConfig;
use crate::learning_curve::LearningCurveConfig;
use crate::median::MedianStoppingConfig;
use crate::objective::Objective;
use crate::pbt_config::{Pb2Config, PbtConfig};
use crate::resource_changing::{ResourceChanging, WorkerAllocation};
use crate::settings::{invalid, objective, ConfigError};
use crate::{AshaType, Fifo, Scheduler};

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
    /// Stops trials whose extrapolated learning curve is unlikely to beat
    /// the best (a curve-fit ensemble with a prior from finished trials).
    LearningCurve(LearningCurveConfig),
    /// Population-based training.
    Pbt(PbtConfig),
    /// Population-based bandits: PBT exploring by GP-UCB.
    Pb2(Pb2Config),
    /// Another scheduler, with trials' numbers of workers changed at checkpoints.
    ResourceChanging(ResourceChangingConfig),
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
            SchedulerConfig::LearningCurve(_) => "learning_curve",
            SchedulerConfig::Pbt(_) => "pbt",
            SchedulerConfig::Pb2(_) => "pb2",
            SchedulerConfig::ResourceChanging(_) => "resource_changing",
        }
    }

    /// Whether the scheduler pauses trials (and so resumes them from checkpoints).
    pub fn pauses_trials(&self) -> bool {
        match self {
            SchedulerConfig::Fifo | SchedulerConfig::LearningCurve(_) => false,
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
            SchedulerConfig::Asha(c) => Box::new(c.build(default_metric, default_mode)?),
            SchedulerConfig::Hyperband(c) | SchedulerConfig::HyperbandBohb(c) => Box::new(c.build(default_metric, default_mode)?),
            SchedulerConfig::MedianStopping(c) => Box::new(c.build(default_metric, default_mode)?),
            SchedulerConfig::LearningCurve(c) => Box::new(c.build(default_metric, default_mode)?),
            SchedulerConfig::ResourceChanging(c) => Box::new(c.build(default_metric, default_mode)?),
            SchedulerConfig::Pb2(c) => Box::new(c.build(default_metric, default_mode)?),
            SchedulerConfig::Pbt(c) => Box::new(c.build(default_metric, default_mode)?),
        })
    }
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

impl ResourceChangingConfig {
    /// Checks the settings and builds the wrapper around its base; `metric`
    /// and `mode` default to the experiment's.
    pub(crate) fn build(&self, default_metric: Option<&str>, default_mode: Option<Mode>) -> Result<ResourceChanging, ConfigError> {
        let c = self;
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
        Ok(ResourceChanging::new(base, obj, c.allocation, c.max_workers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use search::Domain;

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
        assert_eq!((a.asha_type, a.max_t, a.grace_period, a.reduction_factor, a.brackets), (AshaType::Promotion, 27.0, None, 3.0, 1));
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
        assert!(asha(&|c| c.grace_period = Some(200.0)).unwrap().starts_with("scheduler.grace_period: 200 is greater than max_t = 100"));
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
