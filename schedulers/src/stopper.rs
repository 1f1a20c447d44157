//! Stoppers: experiment-level rules that end a trial (or the whole sweep)
//! regardless of the scheduler.

use std::collections::BTreeMap;

use search::TrialResult;

/// Decides from a trial's results whether it should stop.
pub trait Stopper: Send {
    /// Called after each stored result; `true` ends the trial (TERMINATED).
    fn should_stop_trial(&mut self, trial_id: &str, result: &TrialResult) -> bool;

    /// Called after each stored result; `true` ends the whole sweep.
    fn should_stop_all(&mut self) -> bool {
        false
    }

    /// Whether [`Stopper::should_stop_trial`] may ever end a trial. When
    /// neither it nor the scheduler can decide anything on a result, a
    /// trial's ranks go on from each report without waiting for the loop
    /// (a stop reaches them as a stop request). By default it may.
    fn stops_trials(&self) -> bool {
        true
    }
}

/// Ray Tune's dict form: stop a trial once any named metric is `>=` its
/// threshold (`training_iteration = 20`, `val_accuracy = 0.99`). As in Ray,
/// the comparison is always `>=`, whatever the experiment's mode; a NaN
/// metric never meets a threshold. `done` (Ray's `stop={"done": True}`)
/// is the result's `done` flag when no metric has that name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricThresholds(pub BTreeMap<String, f64>);

impl Stopper for MetricThresholds {
    fn should_stop_trial(&mut self, _trial_id: &str, result: &TrialResult) -> bool {
        self.0.iter().any(|(k, &t)| match result.metric(k) {
            Some(v) => v >= t,
            None => k == "done" && f64::from(u8::from(result.done())) >= t,
        })
    }
    fn stops_trials(&self) -> bool {
        !self.0.is_empty()
    }
}

/// A stopper from a closure, `|trial_id, result| -> bool`.
pub struct FnStopper<F>(pub F);

impl<F: FnMut(&str, &TrialResult) -> bool + Send> Stopper for FnStopper<F> {
    fn should_stop_trial(&mut self, trial_id: &str, result: &TrialResult) -> bool {
        (self.0)(trial_id, result)
    }
}

/// Stops when any of its stoppers does.
#[derive(Default)]
pub struct CombinedStopper(pub Vec<Box<dyn Stopper>>);

impl Stopper for CombinedStopper {
    fn should_stop_trial(&mut self, trial_id: &str, result: &TrialResult) -> bool {
        // Every stopper sees every result, even after one has fired.
        self.0.iter_mut().fold(false, |acc, s| s.should_stop_trial(trial_id, result) | acc)
    }
    fn should_stop_all(&mut self) -> bool {
        self.0.iter_mut().fold(false, |acc, s| s.should_stop_all() | acc)
    }
    fn stops_trials(&self) -> bool {
        self.0.iter().any(|s| s.stops_trials())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(iter: u64, acc: f64) -> TrialResult {
        TrialResult {
            extra: None,
            trial_id: "t".into(),
            seq: iter - 1,
            training_iteration: iter,
            metrics: [("acc".to_string(), acc)].into_iter().collect(),
            checkpoint: None,
        }
    }

    #[test]
    fn thresholds_stop_at_or_above() {
        let mut s = MetricThresholds([("training_iteration".to_string(), 3.0), ("acc".to_string(), 0.9)].into_iter().collect());
        assert!(!s.should_stop_trial("t", &result(1, 0.5)));
        assert!(s.should_stop_trial("t", &result(3, 0.5)));
        assert!(s.should_stop_trial("t", &result(1, 0.9)));
        assert!(!s.should_stop_trial("t", &result(1, f64::NAN)));
    }

    #[test]
    fn done_is_the_results_flag() {
        let mut s = MetricThresholds([("done".to_string(), 1.0)].into_iter().collect());
        let mut r = result(1, 0.5);
        assert!(!s.should_stop_trial("t", &r));
        r.extra = Some(serde_json::json!({"done": false}));
        assert!(!s.should_stop_trial("t", &r));
        r.extra = Some(serde_json::json!({"done": true}));
        assert!(s.should_stop_trial("t", &r));
        assert!(r.done());
        // A metric named `done` is a metric like any other.
        r.metrics.insert("done".into(), 0.0);
        assert!(!s.should_stop_trial("t", &r));
    }

    #[test]
    fn closures_and_combinations() {
        let mut c = CombinedStopper(vec![
            Box::new(FnStopper(|_: &str, r: &TrialResult| r.metric("acc").is_some_and(|a| a < 0.1))),
            Box::new(MetricThresholds([("acc".to_string(), 0.95)].into_iter().collect())),
        ]);
        assert!(c.should_stop_trial("t", &result(1, 0.05)));
        assert!(!c.should_stop_trial("t", &result(1, 0.5)));
        assert!(c.should_stop_trial("t", &result(1, 0.99)));
        // Whether any may stop a trial: thresholds only when there are some.
        assert!(c.stops_trials());
        assert!(!MetricThresholds::default().stops_trials());
        assert!(!CombinedStopper(vec![Box::new(MetricThresholds::default())]).stops_trials());
        assert!(!CombinedStopper::default().stops_trials());
    }
}
