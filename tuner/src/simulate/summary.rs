//! A finished simulation, read trial by trial from its store: what
//! `nestor simulate` prints, in memory that does not grow with the trials
//! (a `ResultGrid` holds every result of every trial).

use std::collections::BTreeMap;

use schedulers::TrialStatus;
use search::Mode;

use super::compare::{Outcome, Scorer};
use super::Curves;
use crate::store::{Store, StoreError, TrialRecord};

/// Errors listed at most; the rest are counted.
const ERRORS_LISTED: usize = 20;

/// A finished simulation in brief.
#[derive(Debug)]
pub struct Summary {
    /// The metric (the curves').
    pub metric: String,
    /// Trials by status.
    pub counts: BTreeMap<TrialStatus, u64>,
    /// Results stored, over all trials.
    pub iterations: u64,
    /// The best trial by its last value of the metric (ties: the earlier
    /// trial), with that value.
    pub best: Option<(TrialRecord, f64)>,
    /// The first failed trials, with their errors.
    pub errors: Vec<(String, String)>,
    /// The chosen config's final value against the best tried, and the compute spent.
    pub outcome: Outcome,
}

impl Summary {
    /// Reads `store`'s trials once, in creation order.
    pub fn read(store: &Store, curves: &Curves, mode: Mode) -> Result<Self, StoreError> {
        let metric = curves.metric().to_string();
        let mut scorer = Scorer::new(curves, mode);
        let (mut counts, mut iterations, mut errors) = (BTreeMap::new(), 0, Vec::new());
        let mut best: Option<(TrialRecord, f64)> = None;
        for record in store.each_trial() {
            let record = record?;
            *counts.entry(record.status).or_insert(0) += 1;
            iterations += record.num_results;
            scorer.add(&record.config, record.last_result.as_ref());
            if record.status == TrialStatus::Error && errors.len() < ERRORS_LISTED {
                errors.push((record.id.clone(), record.error.clone().unwrap_or_default()));
            }
            let value = record.last_result.as_ref().and_then(|r| r.metrics.get(&metric)).copied().filter(|v| v.is_finite());
            if let Some(v) = value {
                if best.as_ref().is_none_or(|(_, b)| mode.better(v, *b)) {
                    best = Some((record, v));
                }
            }
        }
        Ok(Self { metric, counts, iterations, best, errors, outcome: scorer.finish(None) })
    }

    /// How many trials.
    pub fn trials(&self) -> u64 {
        self.counts.values().sum()
    }
}
