//! Repeats each config several times (Ray Tune's `Repeater`): every
//! suggestion of the wrapped searcher runs `repeat` times, as trials whose
//! configs differ only in `__trial_index__` (0, 1, ...; the training code
//! derives its seed from it), and the wrapped searcher learns the mean of
//! the repeats, once all of them have ended.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::SearchError;
use crate::searcher::{Searcher, Suggestion};
use crate::types::{metrics_serde, Config, Metrics, TrialResult};

/// The config key that numbers a config's repeats.
pub const TRIAL_INDEX: &str = "__trial_index__";

/// One config's repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Group {
    /// The config the wrapped searcher suggested (without the index).
    config: Config,
    /// Repeats created so far.
    created: usize,
    /// Trials of the group that have not ended.
    live: Vec<String>,
    /// The last results of the repeats that ended well.
    #[serde(default)]
    results: Vec<Final>,
    /// Repeats that failed.
    #[serde(default)]
    failed: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Final {
    training_iteration: u64,
    #[serde(with = "metrics_serde")]
    metrics: Metrics,
}

/// Runs each suggestion of `inner` `repeat` times; see the module documentation.
pub struct Repeater<S> {
    inner: S,
    repeat: usize,
    /// Groups by the id the wrapped searcher knows them by (their first trial's).
    groups: BTreeMap<String, Group>,
    /// Trial id -> its group.
    member_of: BTreeMap<String, String>,
    /// The group still being created.
    filling: Option<String>,
}

impl<S: Searcher> Repeater<S> {
    /// Repeats every suggestion of `inner` `repeat` times (at least 1).
    pub fn new(inner: S, repeat: usize) -> Self {
        Self { inner, repeat: repeat.max(1), groups: BTreeMap::new(), member_of: BTreeMap::new(), filling: None }
    }

    fn indexed(config: &Config, index: usize) -> Config {
        let mut c = config.clone();
        if let Value::Object(m) = &mut c {
            m.insert(TRIAL_INDEX.to_string(), Value::from(index));
        }
        c
    }

    /// The mean of the repeats' metrics (those every repeat reported).
    fn mean(group_id: &str, results: &[Final]) -> Option<TrialResult> {
        let first = results.first()?;
        let mut metrics = Metrics::new();
        for key in first.metrics.keys() {
            let values: Option<Vec<f64>> = results.iter().map(|r| r.metrics.get(key).copied()).collect();
            if let Some(v) = values {
                metrics.insert(key.clone(), v.iter().sum::<f64>() / v.len() as f64);
            }
        }
        let training_iteration = results.iter().map(|r| r.training_iteration).max().unwrap_or(0);
        Some(TrialResult { extra: None, trial_id: group_id.to_string(), seq: 0, training_iteration, metrics, checkpoint: None })
    }
}

impl<S: Searcher> Searcher for Repeater<S> {
    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        if let Some(gid) = self.filling.clone() {
            if let Some(g) = self.groups.get_mut(&gid) {
                let config = Self::indexed(&g.config, g.created);
                g.created += 1;
                g.live.push(trial_id.to_string());
                if g.created >= self.repeat {
                    self.filling = None;
                }
                self.member_of.insert(trial_id.to_string(), gid);
                return Suggestion::Config(config);
            }
        }
        match self.inner.suggest(trial_id) {
            Suggestion::Config(config) => {
                let group = Group { config: config.clone(), created: 1, live: vec![trial_id.to_string()], results: Vec::new(), failed: 0 };
                self.groups.insert(trial_id.to_string(), group);
                self.member_of.insert(trial_id.to_string(), trial_id.to_string());
                if self.repeat > 1 {
                    self.filling = Some(trial_id.to_string());
                }
                Suggestion::Config(Self::indexed(&config, 0))
            }
            other => other,
        }
    }

    fn on_trial_complete(&mut self, trial_id: &str, result: Option<&TrialResult>, error: bool) {
        let Some(gid) = self.member_of.remove(trial_id) else { return };
        let Some(g) = self.groups.get_mut(&gid) else { return };
        g.live.retain(|t| t != trial_id);
        match result {
            Some(r) if !error => g.results.push(Final { training_iteration: r.training_iteration, metrics: r.metrics.clone() }),
            _ => g.failed += 1,
        }
        if g.live.is_empty() && g.created >= self.repeat {
            let done = self.groups.remove(&gid);
            let mean = done.as_ref().and_then(|g| Self::mean(&gid, &g.results));
            self.inner.on_trial_complete(&gid, mean.as_ref(), mean.is_none());
        }
    }

    fn total_trials(&self) -> Option<u64> {
        self.inner.total_trials().map(|n| n * self.repeat as u64)
    }

    fn save(&self) -> Value {
        json!({
            "version": 1,
            "kind": "repeater",
            "repeat": self.repeat,
            "groups": self.groups,
            "member_of": self.member_of,
            "filling": self.filling,
            "inner": self.inner.save(),
        })
    }

    fn restore(&mut self, state: &Value) -> Result<(), SearchError> {
        if state["version"].as_u64() != Some(1) || state["kind"] != "repeater" {
            return Err(SearchError::State(format!("not a version-1 repeater state: {state}")));
        }
        if state["repeat"].as_u64() != Some(self.repeat as u64) {
            return Err(SearchError::State(format!(
                "state was saved with repeat = {}, this searcher repeats {}",
                state["repeat"], self.repeat
            )));
        }
        let err = |e: serde_json::Error| SearchError::State(format!("repeater state: {e}"));
        self.groups = serde_json::from_value(state["groups"].clone()).map_err(err)?;
        self.member_of = serde_json::from_value(state["member_of"].clone()).map_err(err)?;
        self.filling = serde_json::from_value(state["filling"].clone()).map_err(err)?;
        self.inner.restore(&state["inner"])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BasicVariantGenerator, Domain, Space};

    /// Records what the wrapped searcher is told.
    struct Recorder {
        inner: BasicVariantGenerator,
        told: Vec<(String, Option<f64>, bool)>,
    }

    impl Searcher for Recorder {
        fn suggest(&mut self, trial_id: &str) -> Suggestion {
            self.inner.suggest(trial_id)
        }
        fn on_trial_complete(&mut self, trial_id: &str, result: Option<&TrialResult>, error: bool) {
            self.told.push((trial_id.to_string(), result.and_then(|r| r.metric("loss")), error));
        }
        fn total_trials(&self) -> Option<u64> {
            self.inner.total_trials()
        }
        fn save(&self) -> Value {
            self.inner.save()
        }
        fn restore(&mut self, state: &Value) -> Result<(), SearchError> {
            self.inner.restore(state)
        }
    }

    fn recorder() -> Recorder {
        let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
        Recorder { inner: BasicVariantGenerator::new(space, 2, 5), told: Vec::new() }
    }

    fn done(id: &str, loss: f64) -> TrialResult {
        TrialResult {
            extra: None,
            trial_id: id.into(),
            seq: 0,
            training_iteration: 4,
            metrics: [("loss".into(), loss)].into_iter().collect(),
            checkpoint: None,
        }
    }

    fn config(s: Suggestion) -> Config {
        match s {
            Suggestion::Config(c) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_config_runs_n_times_and_the_searcher_learns_the_mean() {
        let mut r = Repeater::new(recorder(), 3);
        assert_eq!(r.total_trials(), Some(6));
        let cs: Vec<Config> = (0..6).map(|i| config(r.suggest(&format!("t{i}")))).collect();
        assert_eq!(r.suggest("t6"), Suggestion::Finished);
        for (i, c) in cs.iter().enumerate() {
            assert_eq!(c[TRIAL_INDEX], i % 3);
            assert_eq!(c["x"], cs[i / 3 * 3]["x"], "a group's repeats share the config");
        }
        assert_ne!(cs[0]["x"], cs[3]["x"]);
        // The second group ends first, with a failed repeat: the mean of the other two.
        r.on_trial_complete("t3", Some(&done("t3", 1.0)), false);
        r.on_trial_complete("t4", None, true);
        r.on_trial_complete("t0", Some(&done("t0", 2.0)), false);
        assert!(r.inner.told.is_empty(), "told before every repeat ended");
        r.on_trial_complete("t5", Some(&done("t5", 3.0)), false);
        assert_eq!(r.inner.told, vec![("t3".to_string(), Some(2.0), false)]);
        // Saved and restored midway, the first group still averages all three.
        let saved = r.save();
        let mut back = Repeater::new(recorder(), 3);
        back.restore(&saved).unwrap();
        back.on_trial_complete("t1", Some(&done("t1", 4.0)), false);
        back.on_trial_complete("t2", Some(&done("t2", 6.0)), false);
        assert_eq!(back.inner.told, vec![("t0".to_string(), Some(4.0), false)]);
        assert!(Repeater::new(recorder(), 2).restore(&saved).unwrap_err().to_string().contains("repeat = 3"));
    }

    #[test]
    fn a_group_whose_repeats_all_fail_is_a_failure() {
        let mut r = Repeater::new(recorder(), 2);
        let _ = r.suggest("a");
        let _ = r.suggest("b");
        r.on_trial_complete("a", None, true);
        r.on_trial_complete("b", Some(&done("b", 1.0)), true);
        assert_eq!(r.inner.told, vec![("a".to_string(), None, true)]);
    }
}
