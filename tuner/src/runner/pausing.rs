//! Paused trials: which one resumes when a slot frees (the scheduler's
//! choice), the ones the scheduler gave up on, and the scheduler's state
//! saved so a resumed sweep continues the same schedule.

use schedulers::{TrialStatus, TrialView};
use trainer::StopLevel;

use super::{view, Ending, Runner};
use crate::store::TrialRecord;
use crate::TuneError;

impl Runner {
    /// Picks a PAUSED trial to resume, as the scheduler chooses.
    pub(super) fn resume_paused(&mut self, can_add: bool) -> Option<TrialRecord> {
        if self.trials.paused.is_empty() {
            return None;
        }
        let views: Vec<TrialView<'_>> = self.trials.paused.iter().map(view).collect();
        let i = self.scheduler.choose_trial_to_run(&views, can_add)?;
        let rec = (i < self.trials.paused.len()).then(|| self.trials.paused.remove(i))?;
        self.searcher.on_trial_resume(&rec.id);
        Some(rec)
    }

    /// Ends the trials the scheduler gave up on: PAUSED ones at once, running
    /// ones through a graceful stop.
    pub(super) fn apply_stopped(&mut self) -> Result<(), TuneError> {
        for id in self.scheduler.take_stopped() {
            if let Some(i) = self.trials.paused.iter().position(|p| p.id == id) {
                let rec = self.trials.paused.remove(i);
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
        self.trials.seen.remove(&rec.id);
        if let Err(e) = self.store.put_meta("searcher", &self.searcher.save()) {
            tracing::warn!(error = %e, "could not save the searcher state");
        }
        self.commits.push_end(rec);
        Ok(())
    }

    /// Writes the scheduler's state when it changed, with how many results
    /// of each live trial it has seen, so a resumed sweep continues the same
    /// schedule (made durable with the next flush; a resume replays the
    /// results stored after it). Results that left the state as it was are
    /// not worth a write: replaying them leaves it so again.
    pub(super) fn save_scheduler(&mut self) -> Result<(), TuneError> {
        let state = self.scheduler.save();
        let text = state.to_string();
        if text != self.phase.saved_scheduler {
            self.store.put_meta("scheduler", &serde_json::json!({ "version": 1, "scheduler": state, "seen": self.trials.seen }))?;
            self.phase.saved_scheduler = text;
        }
        Ok(())
    }
}
