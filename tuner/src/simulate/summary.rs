//! A finished simulation, trial by trial: what `nestor simulate` prints,
//! in memory that does not grow with the trials (a `ResultGrid` holds every
//! result of every trial). The trials may come in any order: those a sweep
//! let go of as it ran (`Tuner::keep_best`), then those its store kept.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use schedulers::TrialStatus;
use search::Mode;

use super::compare::{Outcome, Scorer};
use crate::curves::Curves;
use crate::store::{Store, StoreError, TrialRecord};
use crate::{TuneError, Tuner};

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
    /// The first failed trials (by creation), with their errors.
    pub errors: Vec<(u64, String, String)>,
    /// The chosen config's final value against the best tried, and the compute spent.
    pub outcome: Outcome,
}

/// A [`Summary`] being summed up.
pub struct Summing {
    mode: Mode,
    scorer: Scorer,
    summary: Summary,
}

impl Summing {
    /// No trial yet.
    pub fn new(curves: &Curves, mode: Mode) -> Self {
        let outcome = Outcome { spent: 0.0, chosen: f64::NAN, best: f64::NAN, regret: f64::INFINITY };
        let summary = Summary {
            metric: curves.metric().to_string(),
            counts: BTreeMap::new(),
            iterations: 0,
            best: None,
            errors: Vec::new(),
            outcome,
        };
        Self { mode, scorer: Scorer::new(curves, mode), summary }
    }

    /// One more trial.
    pub fn add(&mut self, record: TrialRecord) {
        let s = &mut self.summary;
        *s.counts.entry(record.status).or_insert(0) += 1;
        s.iterations += record.num_results;
        self.scorer.add(record.index, &record.config, record.last_result.as_ref());
        if record.status == TrialStatus::Error {
            let at = s.errors.partition_point(|(i, _, _)| *i < record.index);
            if at < ERRORS_LISTED {
                s.errors.insert(at, (record.index, record.id.clone(), record.error.clone().unwrap_or_default()));
                s.errors.truncate(ERRORS_LISTED);
            }
        }
        let value = record.last_result.as_ref().and_then(|r| r.metrics.get(&s.metric)).copied().filter(|v| v.is_finite());
        if let Some(v) = value {
            let better = |(b, bv): &(TrialRecord, f64)| self.mode.better(v, *bv) || (v == *bv && record.index < b.index);
            if s.best.as_ref().is_none_or(better) {
                s.best = Some((record, v));
            }
        }
    }

    /// Adds `store`'s trials, in the order of their ids.
    pub fn add_store(&mut self, store: &Store) -> Result<(), StoreError> {
        for record in store.each_trial() {
            self.add(record?);
        }
        Ok(())
    }

    /// The summary.
    pub fn finish(self) -> Summary {
        Summary { outcome: self.scorer.finish(None), ..self.summary }
    }
}

/// Runs `tuner`'s simulated sweep on `curves` and sums it up. With
/// `keep`, the store keeps the best `keep` finished trials and the others
/// are summed up as they end ([`Tuner::keep_best`]). Returns the store,
/// still open, with the summary.
pub fn run(tuner: Tuner, curves: &Curves, mode: Mode, keep: Option<usize>) -> Result<(Store, Summary), TuneError> {
    let summing = Arc::new(Mutex::new(Summing::new(curves, mode)));
    let tuner = match keep {
        Some(n) => {
            let folding = summing.clone();
            tuner.keep_best(n, move |record| folding.lock().unwrap_or_else(PoisonError::into_inner).add(record))
        }
        None => tuner,
    };
    let store = tuner.run()?;
    let mut summing = std::mem::replace(&mut *summing.lock().unwrap_or_else(PoisonError::into_inner), Summing::new(curves, mode));
    summing.add_store(&store)?;
    Ok((store, summing.finish()))
}

impl Summary {
    /// Reads `store`'s trials once.
    pub fn read(store: &Store, curves: &Curves, mode: Mode) -> Result<Self, StoreError> {
        let mut s = Summing::new(curves, mode);
        s.add_store(store)?;
        Ok(s.finish())
    }

    /// How many trials.
    pub fn trials(&self) -> u64 {
        self.counts.values().sum()
    }
}
