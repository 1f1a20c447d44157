//! Helpers shared by the schedulers' tests: trial views and results.

#![allow(dead_code)]

use schedulers::{Scheduler, SchedulerConfig, TrialStatus, TrialView};
use search::{Mode, TrialResult};

/// Every trial's config (schedulers do not look at it).
pub const CONFIG: serde_json::Value = serde_json::Value::Null;

/// A view of trial `id` in `status`.
pub fn view_in(id: &str, status: TrialStatus) -> TrialView<'_> {
    TrialView { id, config: &CONFIG, status, num_results: 0, num_workers: 1 }
}

/// A view of running trial `id`.
pub fn view(id: &str) -> TrialView<'_> {
    view_in(id, TrialStatus::Running)
}

/// Views of paused trials named `names`.
pub fn paused(names: &[String]) -> Vec<TrialView<'_>> {
    names.iter().map(|n| view_in(n, TrialStatus::Paused)).collect()
}

/// `choose_trial_to_run`'s choice among `paused`, as its place in the list.
pub fn choose(s: &mut dyn Scheduler, paused: &[TrialView<'_>], can_add: bool) -> Option<usize> {
    let id = s.choose_trial_to_run(&paused.to_vec(), can_add)?;
    Some(paused.iter().position(|t| t.id == id).unwrap_or_else(|| panic!("chose {id}, not a paused trial")))
}

/// Result `t` of trial `id`, with `loss`.
pub fn result(id: &str, t: u64, loss: f64) -> TrialResult {
    TrialResult {
        extra: None,
        trial_id: id.into(),
        seq: t - 1,
        training_iteration: t,
        metrics: [("loss".to_string(), loss), ("training_iteration".to_string(), t as f64)].into_iter().collect(),
        checkpoint: None,
    }
}

/// `t0`, `t1`, ...
pub fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("t{i}")).collect()
}

/// The scheduler `c` describes, over `loss` in `mode`.
pub fn build(c: SchedulerConfig, mode: Mode) -> Box<dyn Scheduler> {
    c.build(Some("loss"), Some(mode)).unwrap_or_else(|e| panic!("{e}"))
}
