//! Paused trials: which one resumes when a slot frees (the scheduler's
//! choice), and the ones the scheduler gave up on.

use std::collections::{BTreeMap, HashMap};

use schedulers::{Paused, TrialStatus, TrialView};
use trainer::StopLevel;

use super::{view, Ending, Runner};
use crate::store::TrialRecord;
use crate::TuneError;

/// The PAUSED trials, oldest first, found by id: what the scheduler picks
/// among. A choice, a pause and a resume each cost a lookup, not a pass
/// over every paused trial (under promotion ASHA most trials are paused).
#[derive(Default)]
pub(crate) struct PausedTrials {
    by_index: BTreeMap<u64, TrialRecord>,
    index_of: HashMap<String, u64>,
}

impl PausedTrials {
    pub(crate) fn insert(&mut self, rec: TrialRecord) {
        self.index_of.insert(rec.id.clone(), rec.index);
        self.by_index.insert(rec.index, rec);
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<TrialRecord> {
        let index = self.index_of.remove(id)?;
        self.by_index.remove(&index)
    }

    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut TrialRecord> {
        let index = self.index_of.get(id)?;
        self.by_index.get_mut(index)
    }

    /// Every paused trial, oldest first, taken out.
    pub(crate) fn take(&mut self) -> Vec<TrialRecord> {
        self.index_of.clear();
        std::mem::take(&mut self.by_index).into_values().collect()
    }
}

impl From<Vec<TrialRecord>> for PausedTrials {
    fn from(records: Vec<TrialRecord>) -> Self {
        let mut paused = Self::default();
        records.into_iter().for_each(|r| paused.insert(r));
        paused
    }
}

impl Paused for PausedTrials {
    fn len(&self) -> usize {
        self.by_index.len()
    }
    fn get(&self, id: &str) -> Option<TrialView<'_>> {
        self.index_of.get(id).and_then(|i| self.by_index.get(i)).map(view)
    }
    fn iter(&self) -> Box<dyn Iterator<Item = TrialView<'_>> + '_> {
        Box::new(self.by_index.values().map(view))
    }
}

impl Runner {
    /// Picks a PAUSED trial to resume, as the scheduler chooses.
    pub(super) fn resume_paused(&mut self, can_add: bool) -> Result<Option<TrialRecord>, TuneError> {
        if self.trials.paused.is_empty() {
            return Ok(None);
        }
        let Some(id) = self.scheduler.choose_trial_to_run(&self.trials.paused, can_add)? else { return Ok(None) };
        let Some(rec) = self.trials.paused.remove(&id) else {
            tracing::warn!(trial = %id, "the scheduler chose a trial that is not paused");
            return Ok(None);
        };
        self.searcher.on_trial_resume(&rec.id);
        Ok(Some(rec))
    }

    /// Carries out what the scheduler decided about trials other than the
    /// one a hook was called for. The trials it gave up on end: PAUSED ones
    /// at once, running ones through a graceful stop. A PAUSED trial it
    /// exploits takes its donor's checkpoint before it runs again (written
    /// into its record, so a crash loses nothing).
    pub(super) fn apply_stopped(&mut self) -> Result<(), TuneError> {
        for e in self.scheduler.take_exploits()? {
            if let Some(rec) = self.trials.paused.get_mut(&e.trial_id) {
                rec.pending_exploit = Some(e);
                self.store.put_trial(rec)?;
            } else if let Some(r) = self.trials.running.get_mut(&e.trial_id).filter(|r| matches!(r.ending, Some(Ending::Paused))) {
                // Told to pause, not exited yet: it exploits instead, as if decided on its result.
                let ending = Ending::Exploit(Box::new(e));
                r.record.decided = ending.decided();
                self.store.put_trial(&r.record)?;
                r.ending = Some(ending);
            } else {
                tracing::warn!(trial = %e.trial_id, "ignoring an exploit of a trial that is not paused");
            }
        }
        for id in self.scheduler.take_stopped()? {
            if let Some(rec) = self.trials.paused.remove(&id) {
                self.terminate_paused(rec)?;
            } else if let Some(r) = self.trials.running.get_mut(&id) {
                r.ending.get_or_insert(Ending::Stopped);
                r.handle.stop(StopLevel::Graceful);
            }
        }
        Ok(())
    }

    /// A PAUSED trial that will not run again ends TERMINATED.
    pub(super) fn terminate_paused(&mut self, mut rec: TrialRecord) -> Result<(), TuneError> {
        rec.status = TrialStatus::Terminated;
        rec.ended_at = Some(self.clock.unix_now());
        self.store.put_trial(&rec)?;
        self.searcher.on_trial_complete(&rec.id, rec.last_result.as_ref(), false);
        self.scheduler.forget(&rec.id);
        if let Err(e) = self.store.put_searcher(&self.searcher.save()) {
            tracing::warn!(error = %e, "could not save the searcher state");
        }
        self.commits.push_end(rec);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paused_trials_are_listed_oldest_first_and_found_by_id() {
        let rec = |i: u64| TrialRecord::new(crate::runner::trial_id(i), i, serde_json::json!({ "i": i }), 0.0);
        let mut paused = PausedTrials::from(vec![rec(7), rec(2)]);
        paused.insert(rec(5));
        paused.insert(rec(11));
        let ids = |p: &PausedTrials| p.iter().map(|t| t.id.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(&paused), ["trial_00002", "trial_00005", "trial_00007", "trial_00011"]);
        assert_eq!(paused.oldest().map(|t| t.id.to_string()).as_deref(), Some("trial_00002"));
        assert_eq!(paused.get("trial_00007").map(|t| t.config["i"].clone()), Some(serde_json::json!(7)));
        assert!(paused.get("trial_00003").is_none());
        assert_eq!(paused.remove("trial_00005").map(|r| r.index), Some(5));
        assert!(paused.remove("trial_00005").is_none(), "removed once");
        assert_eq!(paused.len(), 3);
        assert_eq!(paused.take().iter().map(|r| r.index).collect::<Vec<_>>(), [2, 7, 11]);
        assert!(paused.is_empty() && paused.get("trial_00002").is_none());
    }
}
