//! What a scheduler optimises: the metric, its mode and the time attribute,
//! normalised once so that every scheduler compares scores the same way.

use serde::{Deserialize, Serialize};

use search::{Mode, TrialResult};

/// The metric a scheduler ranks trials by, whether it is minimised or
/// maximised, and the monotone measure of training time its rungs are laid
/// on (`training_iteration` by default, or `time_total_s`, an epoch counter...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Objective {
    /// The metric.
    pub metric: String,
    /// `min` or `max`.
    pub mode: Mode,
    /// The time attribute.
    pub time_attr: String,
}

impl Objective {
    /// An objective over `metric` in `mode`, timed by `training_iteration`.
    pub fn new(metric: impl Into<String>, mode: Mode) -> Self {
        Self { metric: metric.into(), mode, time_attr: "training_iteration".into() }
    }

    /// Times the objective by `time_attr` instead.
    pub fn time_attr(mut self, time_attr: impl Into<String>) -> Self {
        self.time_attr = time_attr.into();
        self
    }

    /// The result's time and score, or `None` when it lacks either (the
    /// Tuner refuses such a result before a scheduler sees it).
    pub fn read(&self, result: &TrialResult) -> Option<(f64, Score)> {
        let t = result.metric(&self.time_attr)?;
        let v = result.metric(&self.metric)?;
        Some((t, Score::of(self.mode, v)))
    }

    /// What every result must carry, with the setting naming each.
    pub(crate) fn required(&self) -> Vec<(String, String)> {
        vec![("scheduler.metric".into(), self.metric.clone()), ("scheduler.time_attr".into(), self.time_attr.clone())]
    }
}

/// A metric value as a score where larger is better. NaN and infinite values
/// (a diverged run) are `Score(None)`, worse than every finite score: never
/// the best, whatever the mode. Ties compare equal.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Score(pub Option<f64>);

impl Score {
    /// The score of `value` under `mode`.
    pub fn of(mode: Mode, value: f64) -> Self {
        if !value.is_finite() {
            return Score(None);
        }
        Score(Some(match mode {
            Mode::Min => -value,
            Mode::Max => value,
        }))
    }

    /// Whether the value was finite.
    pub fn is_finite(self) -> bool {
        self.0.is_some()
    }

    /// The score as a float, non-finite as negative infinity.
    pub fn value(self) -> f64 {
        self.0.unwrap_or(f64::NEG_INFINITY)
    }
}

/// Indices of `scores` best first; equal scores keep their order (earlier
/// arrivals first).
pub(crate) fn ranked(scores: &[Score]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].value().total_cmp(&scores[a].value()));
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_is_worst_in_both_modes() {
        for mode in [Mode::Min, Mode::Max] {
            for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
                assert!(Score::of(mode, bad) < Score::of(mode, 1e300));
                assert!(Score::of(mode, bad) < Score::of(mode, -1e300));
                assert!(!Score::of(mode, bad).is_finite());
            }
        }
        assert!(Score::of(Mode::Min, 1.0) > Score::of(Mode::Min, 2.0));
        assert!(Score::of(Mode::Max, 2.0) > Score::of(Mode::Max, 1.0));
    }

    #[test]
    fn ranking_is_stable_on_ties() {
        let s = [Score(Some(1.0)), Score(None), Score(Some(3.0)), Score(Some(1.0))];
        assert_eq!(ranked(&s), vec![2, 0, 3, 1]);
    }
}
