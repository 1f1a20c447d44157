//! The learning-curve scheduler: stops a trial when its extrapolated
//! learning curve gives it too small a chance of beating the best trial
//! trained to `max_t`, for what the rest of its training would cost
//! (after Domhan et al., IJCAI 2015, with a least-squares ensemble in
//! place of their MCMC, and a prior learned from the sweep's own trials).
//!
//! The rules, decided once here and tested:
//!
//! - A trial is judged at checkpoints of its `time_attr`:
//!   `grace_period * growth^k` below `max_t` (by default `max_t / 256`,
//!   doubling: eight checks). A report that crosses several is judged once.
//! - At a check (with at least three points, until two trials have
//!   finished), the trial's points so far (thinned to about 16 per
//!   doubling) are fitted by [`crate::curve_model::predict`]: a mean and a
//!   spread for its metric at `max_t`.
//! - The prior across trials: every trial that reaches `max_t` (or ends
//!   its training by itself) pairs, for each check it passed, the
//!   prediction made there with its real final value. At check `k`, a line
//!   `final = a + b * prediction` through those pairs (pulled towards the
//!   identity while there are few) turns a prediction into the sweep's
//!   experience of where such predictions end, with the line's residual
//!   spread: curves that all keep improving after the check move `a`, and
//!   predictions that rank well but overshoot move `b`. The chance that a
//!   trial's final value beats the best final value so far is read off
//!   that, mixed with a wide normal prior counted as one finished trial.
//!   Early on the prior dominates and the scheduler is careful; as trials
//!   finish, it learns how well these curves extrapolate.
//! - The trial stops when that chance is below `threshold` times the share
//!   of `max_t` still ahead of it: the more its training would still cost,
//!   the surer it has to be worth it.
//! - Until one trial has finished there is no best to beat: every trial
//!   continues.
//! - A NaN or infinite metric stops the trial at its next check.
//! - No randomness: the same results in the same order give the same
//!   decisions, and a restored state decides as the saved one would have.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use search::{Mode, TrialResult};

use crate::curve_model::{normal_cdf, predict};
use crate::objective::Objective;
use crate::scheduler::{Decision, Scheduler, SchedulerError, TrialView};
use crate::settings::{halving, hundred, invalid, objective, positive, training_iteration, ConfigError};

/// Points kept per trial: a new one replaces the last unless the time has
/// grown by this factor since the one before.
const THIN: f64 = 1.044;
/// The prior's pseudo-count and its residual scale.
/// The wide prior counts as this many finished trials.
const PRIOR_WEIGHT: f64 = 1.0;
/// How strongly the map from predictions to finals is pulled towards the
/// identity (in finished trials' worth).
const RIDGE: f64 = 2.0;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct TrialState {
    /// (time / max_t, loss), thinned.
    points: Vec<(f64, f64)>,
    /// The lowest check it has not been judged at.
    next_check: usize,
    /// (check, mean, spread) of the predictions made at its checks.
    predictions: Vec<(usize, f64, f64)>,
    /// Ended: stopped, complete or failed.
    finished: bool,
}

impl TrialState {
    /// Ends the trial: its points go, its predictions are handed back.
    fn end(&mut self) -> Vec<(usize, f64, f64)> {
        self.finished = true;
        self.points = Vec::new();
        std::mem::take(&mut self.predictions)
    }
}

/// The learning-curve scheduler; see the module documentation.
#[derive(Debug, Clone)]
pub struct LearningCurve {
    objective: Objective,
    max_t: f64,
    checks: Vec<f64>,
    threshold: f64,
    trials: BTreeMap<String, TrialState>,
    /// Per check: (the prediction made there, the final value) of each
    /// trial that finished.
    residuals: Vec<Vec<(f64, f64)>>,
    /// The best final loss (the metric, smaller better) so far.
    best: Option<f64>,
}

impl LearningCurve {
    /// The scheduler over `objective` (settings checked by [`crate::SchedulerConfig`]).
    pub fn new(objective: Objective, max_t: f64, grace_period: f64, growth: f64, threshold: f64) -> Self {
        let checks: Vec<f64> = (0..).map(|k| grace_period * growth.powi(k)).take_while(|&m| m < max_t).take(64).collect();
        let residuals = vec![Vec::new(); checks.len()];
        Self { objective, max_t, checks, threshold, trials: BTreeMap::new(), residuals, best: None }
    }

    /// The times at which trials are judged.
    pub fn checks(&self) -> &[f64] {
        &self.checks
    }

    fn loss(&self, value: f64) -> f64 {
        match self.objective.mode {
            Mode::Min => value,
            Mode::Max => -value,
        }
    }

    /// The chance that a trial predicted at check `k` ends below `best`.
    fn chance(&self, k: usize, mean: f64, sd: f64, best: f64) -> f64 {
        // The prior: a normal centred on the prediction, three times as
        // wide as its own spread plus a quarter of its level.
        let wide = 3.0 * sd + 0.25 * mean.abs();
        let prior = normal_cdf((best - mean) / wide);
        let pairs = &self.residuals[k];
        if pairs.len() < 2 {
            return prior;
        }
        // What the sweep has learned at this check: final = a + b *
        // prediction over the trials that finished (ridge towards b = 1),
        // with the residual spread of that line at this prediction.
        let n = pairs.len() as f64;
        let mp = pairs.iter().map(|p| p.0).sum::<f64>() / n;
        let mf = pairs.iter().map(|p| p.1).sum::<f64>() / n;
        let spp: f64 = pairs.iter().map(|p| (p.0 - mp).powi(2)).sum();
        let spf: f64 = pairs.iter().map(|p| (p.0 - mp) * (p.1 - mf)).sum();
        let pull = RIDGE * spp / n;
        let b = if spp > 0.0 { (spf + pull) / (spp + pull) } else { 1.0 };
        let a = mf - b * mp;
        let residual: f64 = pairs.iter().map(|p| (p.1 - a - b * p.0).powi(2)).sum::<f64>() / (n - 1.0);
        let leverage = 1.0 + 1.0 / n + if spp > 0.0 { (mean - mp).powi(2) / (spp + pull) } else { 0.0 };
        let width = (residual * leverage + (b * sd).powi(2)).sqrt().max(1e-12);
        let learned = normal_cdf((best - a - b * mean) / width);
        (n * learned + PRIOR_WEIGHT * prior) / (n + PRIOR_WEIGHT)
    }

    /// A trial that ended its training: its final value teaches the prior.
    fn learn(&mut self, id: &str, final_loss: f64) {
        let Some(state) = self.trials.get_mut(id) else { return };
        if state.finished {
            return;
        }
        let predictions = state.end();
        if !final_loss.is_finite() {
            return;
        }
        for (k, mean, _) in predictions {
            self.residuals[k].push((mean, final_loss));
        }
        if self.best.is_none_or(|b| final_loss < b) {
            self.best = Some(final_loss);
        }
    }

    fn record(state: &mut TrialState, u: f64, loss: f64) {
        let n = state.points.len();
        if n >= 2 && state.points[n - 1].0 < state.points[n - 2].0 * THIN {
            state.points[n - 1] = (u, loss);
        } else {
            state.points.push((u, loss));
        }
    }
}

/// The scheduler's saved state.
#[derive(Serialize)]
struct Saved<'a> {
    version: u32,
    kind: &'static str,
    checks: &'a [f64],
    trials: &'a BTreeMap<String, TrialState>,
    residuals: &'a [Vec<(f64, f64)>],
    best: Option<f64>,
}

impl LearningCurve {
    fn saved(&self) -> Saved<'_> {
        Saved {
            version: 1,
            kind: "learning_curve",
            checks: &self.checks,
            trials: &self.trials,
            residuals: &self.residuals,
            best: self.best,
        }
    }
}

impl Scheduler for LearningCurve {
    fn on_trial_result(&mut self, trial: &TrialView<'_>, result: &TrialResult) -> Decision {
        let (Some(t), Some(value)) = (result.metric(&self.objective.time_attr), result.metric(&self.objective.metric)) else {
            return Decision::Continue;
        };
        let loss = if value.is_finite() { self.loss(value) } else { f64::INFINITY };
        let state = self.trials.entry(trial.id.to_string()).or_insert_with(|| TrialState {
            points: Vec::new(),
            next_check: 0,
            predictions: Vec::new(),
            finished: false,
        });
        if state.finished {
            return Decision::Stop;
        }
        if t >= self.max_t {
            self.learn(trial.id, loss);
            return Decision::Stop;
        }
        if loss.is_finite() {
            Self::record(state, t / self.max_t, loss);
        }
        let Some(k) = self.checks.iter().rposition(|&m| m <= t) else { return Decision::Continue };
        if k < state.next_check {
            return Decision::Continue;
        }
        state.next_check = k + 1;
        if !loss.is_finite() {
            state.end();
            return Decision::Stop;
        }
        let Some(p) = predict(&state.points) else { return Decision::Continue };
        state.predictions.push((k, p.mean, p.sd));
        // Fewer than three points say nothing of a curve's shape by
        // themselves: they are judged only once finished trials have shown
        // where such predictions end.
        if state.points.len() < 3 && self.residuals[k].len() < 2 {
            return Decision::Continue;
        }
        let Some(best) = self.best else { return Decision::Continue };
        let ahead = ((self.max_t - t) / self.max_t).clamp(0.0, 1.0);
        let chance = self.chance(k, p.mean, p.sd, best);
        if chance < self.threshold * ahead {
            if let Some(s) = self.trials.get_mut(trial.id) {
                s.end();
            }
            return Decision::Stop;
        }
        Decision::Continue
    }

    fn on_trial_complete(&mut self, trial: &TrialView<'_>, result: Option<&TrialResult>) {
        // A trial that ended its training by itself (its curve ran out
        // before max_t) finished it: its last value is its final one.
        let last = result.and_then(|r| r.metric(&self.objective.metric)).map(|v| if v.is_finite() { self.loss(v) } else { f64::NAN });
        self.learn(trial.id, last.unwrap_or(f64::NAN));
    }

    fn on_trial_error(&mut self, trial: &TrialView<'_>) {
        if let Some(s) = self.trials.get_mut(trial.id) {
            s.end();
        }
    }

    fn required_metrics(&self) -> Vec<(String, String)> {
        self.objective.required()
    }

    fn save(&self) -> Value {
        serde_json::to_value(self.saved()).unwrap_or_default()
    }

    fn save_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.saved()).unwrap_or_default()
    }

    fn restore(&mut self, state: &Value) -> Result<(), SchedulerError> {
        let saved = crate::scheduler::Saved::open(state, "learning_curve", "learning-curve")?;
        let checks: Vec<f64> = saved.field("checks")?;
        if checks != self.checks {
            return Err(SchedulerError::State("the saved learning-curve state has other checks than these settings".into()));
        }
        self.trials = saved.field("trials")?;
        self.residuals = saved.field("residuals")?;
        self.best = saved.field("best")?;
        Ok(())
    }
}

/// The learning-curve scheduler's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LearningCurveConfig {
    /// The metric (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// `min` or `max` (default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// What training time is measured in: any value that grows with
    /// training, best what it costs (`samples_seen`, `flops`, `time_total_s`).
    #[serde(default = "training_iteration")]
    pub time_attr: String,
    /// The end of training, in `time_attr` (default 100).
    #[serde(default = "hundred")]
    pub max_t: f64,
    /// The first check (default `max_t / 256`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<f64>,
    /// Checks at `grace_period * growth^k` (default 2).
    #[serde(default = "two")]
    pub growth: f64,
    /// Stop a trial when its chance of beating the best is below this,
    /// times the share of `max_t` still ahead of it (default 0.1).
    #[serde(default = "ten_percent")]
    pub threshold: f64,
}

fn two() -> f64 {
    2.0
}
fn ten_percent() -> f64 {
    0.1
}

impl Default for LearningCurveConfig {
    fn default() -> Self {
        Self {
            metric: None,
            mode: None,
            time_attr: training_iteration(),
            max_t: hundred(),
            grace_period: None,
            growth: two(),
            threshold: ten_percent(),
        }
    }
}

impl LearningCurveConfig {
    /// Checks the settings and builds the scheduler; `metric` and `mode` default to the experiment's.
    pub(crate) fn build(&self, default_metric: Option<&str>, default_mode: Option<Mode>) -> Result<LearningCurve, ConfigError> {
        let c = self;
        let obj = objective(&c.metric, c.mode, &c.time_attr, default_metric, default_mode)?;
        positive("max_t", c.max_t)?;
        let grace = c.grace_period.unwrap_or(c.max_t / 256.0);
        if !(c.growth > 1.0 && c.growth.is_finite()) {
            return Err(invalid("growth", format!("must be greater than 1, got {}", c.growth)));
        }
        halving(c.max_t, grace, c.growth).map_err(|e| if e.key == "reduction_factor" { invalid("growth", e.message) } else { e })?;
        if !(c.threshold > 0.0 && c.threshold < 1.0) {
            return Err(invalid("threshold", format!("must be in (0, 1), got {}", c.threshold)));
        }
        Ok(LearningCurve::new(obj, c.max_t, grace, c.growth, c.threshold))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::TrialStatus;

    fn view<'a>(id: &'a str, config: &'a Value) -> TrialView<'a> {
        TrialView { id, config, status: TrialStatus::Running, num_results: 0, num_workers: 1 }
    }

    fn result(t: f64, loss: f64) -> TrialResult {
        TrialResult {
            trial_id: String::new(),
            seq: 0,
            training_iteration: t as u64,
            metrics: [("loss".to_string(), loss)].into_iter().collect(),
            checkpoint: None,
            extra: None,
        }
    }

    fn scheduler() -> LearningCurve {
        LearningCurveConfig { max_t: 64.0, ..Default::default() }.build(Some("loss"), Some(Mode::Min)).unwrap()
    }

    /// Feeds trial `id` the curve `f` from iteration 1 until it is stopped
    /// or reaches 64; returns the iteration it ended at.
    fn run(s: &mut LearningCurve, id: &str, f: impl Fn(f64) -> f64) -> u64 {
        let config = Value::Null;
        for t in 1..=64 {
            let d = s.on_trial_result(&view(id, &config), &result(t as f64, f(t as f64)));
            if d == Decision::Stop {
                return t;
            }
        }
        64
    }

    #[test]
    fn a_hopeless_curve_is_stopped_early_and_a_better_one_runs_on() {
        let mut s = scheduler();
        // Power laws towards different floors.
        assert_eq!(run(&mut s, "a", |t| 0.20 + 0.5 * t.powf(-0.5)), 64);
        let hopeless = run(&mut s, "b", |t| 0.60 + 0.5 * t.powf(-0.5));
        assert!(hopeless <= 16, "stopped at {hopeless}");
        assert_eq!(run(&mut s, "c", |t| 0.10 + 0.5 * t.powf(-0.5)), 64);
        assert_eq!(s.best, Some(0.10 + 0.5 * 64f64.powf(-0.5)));
    }

    #[test]
    fn nothing_is_stopped_before_a_trial_has_finished() {
        let mut s = scheduler();
        let config = Value::Null;
        for t in 1..40 {
            for id in ["a", "b", "c"] {
                let d = s.on_trial_result(&view(id, &config), &result(t as f64, if id == "a" { 1.0 } else { 5.0 }));
                assert_eq!(d, Decision::Continue);
            }
        }
    }

    #[test]
    fn a_restored_state_decides_as_the_saved_one() {
        let curves: Vec<Box<dyn Fn(f64) -> f64>> = (0..12)
            .map(|i| {
                let floor = 0.1 + 0.05 * ((i * 7) % 12) as f64;
                let rate = 0.3 + 0.1 * (i % 4) as f64;
                Box::new(move |t: f64| floor + 0.8 * t.powf(-rate)) as Box<dyn Fn(f64) -> f64>
            })
            .collect();
        let mut whole = scheduler();
        let ended: Vec<u64> = curves.iter().enumerate().map(|(i, f)| run(&mut whole, &format!("t{i}"), f)).collect();
        let mut first = scheduler();
        let mut again: Vec<u64> = curves[..6].iter().enumerate().map(|(i, f)| run(&mut first, &format!("t{i}"), f)).collect();
        let mut second = scheduler();
        second.restore(&serde_json::from_slice(&first.save_json()).unwrap()).unwrap();
        again.extend(curves[6..].iter().enumerate().map(|(i, f)| run(&mut second, &format!("t{}", i + 6), f)));
        assert_eq!(ended, again);
        assert!(ended.iter().any(|&e| e < 64), "{ended:?}");
        let other = LearningCurveConfig { max_t: 32.0, ..Default::default() }.build(Some("loss"), Some(Mode::Min)).unwrap();
        assert!(other.clone().restore(&whole.save()).is_err());
    }

    #[test]
    fn settings_are_checked() {
        let err = |f: &dyn Fn(&mut LearningCurveConfig)| {
            let mut c = LearningCurveConfig::default();
            f(&mut c);
            c.build(Some("loss"), Some(Mode::Min)).err().map(|e| e.to_string())
        };
        assert_eq!(err(&|_| {}), None);
        assert!(err(&|c| c.growth = 1.0).unwrap().starts_with("scheduler.growth: must be greater than 1"));
        assert!(err(&|c| c.threshold = 1.5).unwrap().starts_with("scheduler.threshold"));
        assert!(err(&|c| c.grace_period = Some(200.0)).unwrap().starts_with("scheduler.grace_period"));
        let s = LearningCurveConfig { max_t: 256.0, ..Default::default() }.build(Some("loss"), Some(Mode::Min)).unwrap();
        assert_eq!(s.checks(), &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]);
    }
}
