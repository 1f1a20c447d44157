//! Caps how many of a searcher's trials run at once.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::error::SearchError;
use crate::searcher::{Searcher, Suggestion};
use crate::types::TrialResult;

/// Wraps a searcher and answers [`Suggestion::Wait`] while `max_concurrent`
/// of its trials are live (suggested and not yet complete). Useful for
/// model-based searchers that learn from completed trials. A paused trial
/// is not live until it resumes: a scheduler that pauses trials would
/// otherwise stall the search (paused trials wait for new ones that the
/// limiter holds back).
pub struct ConcurrencyLimiter<S> {
    inner: S,
    max_concurrent: usize,
    live: BTreeSet<String>,
    paused: BTreeSet<String>,
}

impl<S: Searcher> ConcurrencyLimiter<S> {
    /// Limits `inner` to `max_concurrent` live trials (at least 1).
    pub fn new(inner: S, max_concurrent: usize) -> Self {
        Self { inner, max_concurrent: max_concurrent.max(1), live: BTreeSet::new(), paused: BTreeSet::new() }
    }
    /// Trials suggested and not yet complete.
    pub fn live(&self) -> usize {
        self.live.len()
    }
}

impl<S: Searcher> Searcher for ConcurrencyLimiter<S> {
    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        if self.live.len() >= self.max_concurrent {
            return Suggestion::Wait;
        }
        let s = self.inner.suggest(trial_id);
        if matches!(s, Suggestion::Config(_)) {
            self.live.insert(trial_id.to_string());
        }
        s
    }
    fn on_trial_result(&mut self, trial_id: &str, result: &TrialResult) {
        self.inner.on_trial_result(trial_id, result);
    }
    fn on_trial_complete(&mut self, trial_id: &str, result: Option<&TrialResult>, error: bool) {
        self.live.remove(trial_id);
        self.paused.remove(trial_id);
        self.inner.on_trial_complete(trial_id, result, error);
    }
    fn on_trial_pause(&mut self, trial_id: &str) {
        if self.live.remove(trial_id) {
            self.paused.insert(trial_id.to_string());
        }
        self.inner.on_trial_pause(trial_id);
    }
    fn on_trial_resume(&mut self, trial_id: &str) {
        if self.paused.remove(trial_id) {
            self.live.insert(trial_id.to_string());
        }
        self.inner.on_trial_resume(trial_id);
    }
    fn total_trials(&self) -> Option<u64> {
        self.inner.total_trials()
    }
    fn save(&self) -> Value {
        json!({ "version": 1, "kind": "limiter", "live": self.live, "paused": self.paused, "inner": self.inner.save() })
    }
    fn restore(&mut self, state: &Value) -> Result<(), SearchError> {
        if state["version"].as_u64() != Some(1) || state["kind"] != "limiter" {
            return Err(SearchError::State(format!("not a version-1 limiter state: {state}")));
        }
        self.live = serde_json::from_value(state["live"].clone()).map_err(|e| SearchError::State(e.to_string()))?;
        // Absent from states saved before pausing existed.
        if let Some(p) = state.get("paused") {
            self.paused = serde_json::from_value(p.clone()).map_err(|e| SearchError::State(e.to_string()))?;
        }
        self.inner.restore(&state["inner"])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BasicVariantGenerator, Domain, Space};

    #[test]
    fn waits_at_the_limit_and_frees_on_completion() {
        let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
        let mut l = ConcurrencyLimiter::new(BasicVariantGenerator::new(space, 10, 0), 2);
        assert!(matches!(l.suggest("a"), Suggestion::Config(_)));
        assert!(matches!(l.suggest("b"), Suggestion::Config(_)));
        assert_eq!(l.suggest("c"), Suggestion::Wait);
        l.on_trial_complete("a", None, false);
        assert!(matches!(l.suggest("c"), Suggestion::Config(_)));
        let saved = l.save();
        let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
        let mut r = ConcurrencyLimiter::new(BasicVariantGenerator::new(space, 10, 0), 2);
        r.restore(&saved).unwrap();
        assert_eq!(r.live(), 2);
        assert_eq!(r.suggest("d"), Suggestion::Wait);
        // A paused trial frees its place until it resumes.
        r.on_trial_pause("b");
        assert_eq!(r.live(), 1);
        assert!(matches!(r.suggest("d"), Suggestion::Config(_)));
        r.on_trial_resume("b");
        assert_eq!(r.live(), 3);
        assert_eq!(r.suggest("e"), Suggestion::Wait);
        r.on_trial_pause("b");
        let saved = r.save();
        r.on_trial_complete("b", None, false);
        assert_eq!(r.live(), 2);
        let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
        let mut back = ConcurrencyLimiter::new(BasicVariantGenerator::new(space, 10, 0), 2);
        back.restore(&saved).unwrap();
        back.on_trial_resume("b");
        assert_eq!(back.live(), 3, "the paused set is restored");
    }
}
