//! The `Searcher` trait: where trial configs come from.

use serde_json::Value;

use crate::error::SearchError;
use crate::types::{Config, TrialResult};

/// What a searcher answers when the Tuner has a free slot.
#[derive(Debug, Clone, PartialEq)]
pub enum Suggestion {
    /// Run a trial with this config.
    Config(Config),
    /// Nothing to suggest now; ask again after a trial completes.
    Wait,
    /// The searcher will suggest no more trials.
    Finished,
}

/// Suggests configurations. One required method; the hooks default to nothing.
///
/// The Tuner calls hooks from its single event loop, in this order for each
/// trial: `suggest` (the trial is created PENDING with that config), then
/// `on_trial_result` for each stored result while it is RUNNING, then
/// `on_trial_complete` once it is TERMINATED or ERROR.
pub trait Searcher: Send {
    /// Called when a slot is free; `trial_id` names the trial to be created.
    fn suggest(&mut self, trial_id: &str) -> Suggestion;

    /// Called after each result of a running trial has been stored.
    fn on_trial_result(&mut self, _trial_id: &str, _result: &TrialResult) {}

    /// Called once when a trial ends; `result` is its last result, if any.
    fn on_trial_complete(&mut self, _trial_id: &str, _result: Option<&TrialResult>, _error: bool) {}

    /// Called when the scheduler pauses a trial (it will resume, or end).
    fn on_trial_pause(&mut self, _trial_id: &str) {}

    /// Called when a paused trial resumes.
    fn on_trial_resume(&mut self, _trial_id: &str) {}

    /// How many trials this searcher will suggest in all, when it decides that
    /// itself (grid and random search do); `None` lets the Tuner stop at
    /// `num_samples`.
    fn total_trials(&self) -> Option<u64> {
        None
    }

    /// The state to persist, so a resumed experiment continues the same
    /// sequence. Must carry a `version` field.
    fn save(&self) -> Value;

    /// Restores state written by [`Searcher::save`].
    fn restore(&mut self, state: &Value) -> Result<(), SearchError>;
}

impl<S: Searcher + ?Sized> Searcher for Box<S> {
    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        (**self).suggest(trial_id)
    }
    fn on_trial_result(&mut self, trial_id: &str, result: &TrialResult) {
        (**self).on_trial_result(trial_id, result)
    }
    fn on_trial_complete(&mut self, trial_id: &str, result: Option<&TrialResult>, error: bool) {
        (**self).on_trial_complete(trial_id, result, error)
    }
    fn on_trial_pause(&mut self, trial_id: &str) {
        (**self).on_trial_pause(trial_id)
    }
    fn on_trial_resume(&mut self, trial_id: &str) {
        (**self).on_trial_resume(trial_id)
    }
    fn total_trials(&self) -> Option<u64> {
        (**self).total_trials()
    }
    fn save(&self) -> Value {
        (**self).save()
    }
    fn restore(&mut self, state: &Value) -> Result<(), SearchError> {
        (**self).restore(state)
    }
}
