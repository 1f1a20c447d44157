//! The median stopping rule (Golovin et al. 2017, Google Vizier; Ray's
//! `MedianStoppingRule`): stop a trial whose best result so far is worse
//! than the median of the other trials' running averages at the same time.
//!
//! At time `t >= grace_period`, with at least `min_samples_required` other
//! trials that have reached `t`, each other trial's running average is the
//! mean of its results between `grace_period` and `t`; the trial stops (or,
//! with `hard_stop = false`, pauses) when its best result is strictly worse
//! than their median. A paused trial is resumed when no new trial can start
//! and then runs to its end, never paused again (as in Ray). A NaN or
//! infinite result counts as the worst score: in a running average it makes
//! the average the worst, and a trial whose every result is non-finite is
//! stopped once enough others are there to judge it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use search::TrialResult;

use crate::objective::{Objective, Score};
use crate::scheduler::{Decision, Scheduler, SchedulerError, TrialView};
use search::Mode;

use crate::settings::{invalid, objective, one, three_usize, training_iteration, yes, ConfigError};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct History {
    /// (time, score) of its results, in time order.
    points: Vec<(f64, Score)>,
    /// Paused once: not judged again.
    #[serde(default)]
    spared: bool,
    /// Up to each point: the sum of the finite scores and the number of
    /// non-finite ones (rebuilt from `points` on restore).
    #[serde(skip)]
    sums: Vec<(f64, u32)>,
}

impl History {
    /// Adds a result. A trial restarted from a checkpoint reports times it
    /// reported before: the results it had after them are superseded.
    fn push(&mut self, t: f64, score: Score) {
        let keep = self.points.partition_point(|(pt, _)| *pt < t);
        self.points.truncate(keep);
        self.sums.truncate(keep);
        let (sum, bad) = self.sums.last().copied().unwrap_or((0.0, 0));
        self.points.push((t, score));
        self.sums.push(match score.0 {
            Some(v) => (sum + v, bad),
            None => (sum, bad + 1),
        });
    }

    fn rebuild(&mut self) {
        let points = std::mem::take(&mut self.points);
        self.sums.clear();
        for (t, s) in points {
            self.push(t, s);
        }
    }

    /// The mean score of its results with time in `[lo, hi]` (the worst
    /// score when there are none, or when one of them is non-finite).
    fn mean(&self, lo: f64, hi: f64) -> f64 {
        let a = self.points.partition_point(|(pt, _)| *pt < lo);
        let b = self.points.partition_point(|(pt, _)| *pt <= hi);
        if b <= a {
            return f64::NEG_INFINITY;
        }
        let (sum_b, bad_b) = self.sums[b - 1];
        let (sum_a, bad_a) = if a == 0 { (0.0, 0) } else { self.sums[a - 1] };
        if bad_b > bad_a {
            f64::NEG_INFINITY
        } else {
            (sum_b - sum_a) / (b - a) as f64
        }
    }
}

/// The median stopping rule; see the module documentation.
#[derive(Debug, Clone)]
pub struct MedianStopping {
    objective: Objective,
    grace_period: f64,
    min_samples: usize,
    hard_stop: bool,
    trials: BTreeMap<String, History>,
}

impl MedianStopping {
    /// The rule over `objective` (settings checked by [`crate::SchedulerConfig`]).
    pub fn new(objective: Objective, grace_period: f64, min_samples_required: usize, hard_stop: bool) -> Self {
        Self { objective, grace_period, min_samples: min_samples_required, hard_stop, trials: BTreeMap::new() }
    }

    fn running_mean(&self, h: &History, t: f64) -> f64 {
        h.mean(self.grace_period, t)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        let (a, b) = (v[n / 2 - 1], v[n / 2]);
        // Two infinities of one sign: their mean is that infinity, not NaN.
        if a == b {
            a
        } else {
            a / 2.0 + b / 2.0
        }
    }
}

/// The median rule's saved state: every live trial's history.
#[derive(Serialize)]
struct Saved<'a> {
    version: u32,
    kind: &'static str,
    trials: &'a BTreeMap<String, History>,
}

impl MedianStopping {
    fn saved(&self) -> Saved<'_> {
        Saved { version: 1, kind: "median_stopping", trials: &self.trials }
    }
}

impl Scheduler for MedianStopping {
    fn on_trial_result(&mut self, trial: &TrialView<'_>, result: &TrialResult) -> Decision {
        let Some((t, score)) = self.objective.read(result) else { return Decision::Continue };
        let h = self.trials.entry(trial.id.to_string()).or_default();
        h.push(t, score);
        if h.spared || t < self.grace_period {
            return Decision::Continue;
        }
        let best = h.points.iter().map(|(_, s)| s.value()).fold(f64::NEG_INFINITY, f64::max);
        let others: Vec<f64> = self
            .trials
            .iter()
            .filter(|(id, o)| id.as_str() != trial.id && o.points.last().is_some_and(|(ot, _)| *ot >= t))
            .map(|(_, o)| self.running_mean(o, t))
            .collect();
        if others.len() < self.min_samples {
            return Decision::Continue;
        }
        let median = median(others);
        let worse = best < median || (best == f64::NEG_INFINITY && median == f64::NEG_INFINITY && !score.is_finite());
        if !worse {
            return Decision::Continue;
        }
        if self.hard_stop {
            Decision::Stop
        } else {
            if let Some(h) = self.trials.get_mut(trial.id) {
                h.spared = true;
            }
            Decision::Pause
        }
    }

    fn required_metrics(&self) -> Vec<(String, String)> {
        self.objective.required()
    }

    fn pauses_trials(&self) -> bool {
        !self.hard_stop
    }

    fn save(&self) -> Value {
        serde_json::to_value(self.saved()).unwrap_or_default()
    }

    fn save_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.saved()).unwrap_or_default()
    }

    fn restore(&mut self, state: &Value) -> Result<(), SchedulerError> {
        self.trials = crate::scheduler::Saved::open(state, "median_stopping", "median-stopping")?.field("trials")?;
        for h in self.trials.values_mut() {
            h.rebuild();
        }
        Ok(())
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

impl MedianStoppingConfig {
    /// Checks the settings and builds the rule; `metric` and `mode` default to the experiment's.
    pub(crate) fn build(&self, default_metric: Option<&str>, default_mode: Option<Mode>) -> Result<MedianStopping, ConfigError> {
        let c = self;
        let obj = objective(&c.metric, c.mode, &c.time_attr, default_metric, default_mode)?;
        if !(c.grace_period >= 0.0 && c.grace_period.is_finite()) {
            return Err(invalid("grace_period", format!("must be 0 or more, got {}", c.grace_period)));
        }
        if c.min_samples_required == 0 {
            return Err(invalid("min_samples_required", "must be at least 1"));
        }
        Ok(MedianStopping::new(obj, c.grace_period, c.min_samples_required, c.hard_stop))
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_means_and_a_restart() {
        let mut h = History::default();
        for (t, v) in [(1.0, 1.0), (2.0, 3.0), (3.0, 5.0)] {
            h.push(t, Score(Some(v)));
        }
        assert_eq!(h.mean(1.0, 3.0), 3.0);
        assert_eq!(h.mean(2.0, 2.5), 3.0);
        assert_eq!(h.mean(4.0, 9.0), f64::NEG_INFINITY);
        // Restarted from the checkpoint of time 1: time 2 again supersedes 2 and 3.
        h.push(2.0, Score(Some(7.0)));
        assert_eq!(h.points.len(), 2);
        assert_eq!(h.mean(1.0, 9.0), 4.0);
        h.push(3.0, Score(None));
        assert_eq!(h.mean(1.0, 2.0), 4.0);
        assert_eq!(h.mean(1.0, 3.0), f64::NEG_INFINITY);
        let mut back: History = serde_json::from_value(serde_json::to_value(&h).unwrap()).unwrap();
        back.rebuild();
        assert_eq!(back, h);
    }
}
