//! Paused trials: which one resumes when a slot frees (the scheduler's
//! choice), and the ones the scheduler gave up on.

use schedulers::{TrialStatus, TrialView};
use trainer::StopLevel;

use super::{view, Ending, Runner};
use crate::store::TrialRecord;
use crate::TuneError;

impl Runner {
    /// Picks a PAUSED trial to resume, as the scheduler chooses.
    pub(super) fn resume_paused(&mut self, can_add: bool) -> Result<Option<TrialRecord>, TuneError> {
        if self.trials.paused.is_empty() {
            return Ok(None);
        }
        let views: Vec<TrialView<'_>> = self.trials.paused.iter().map(view).collect();
        let Some(i) = self.scheduler.choose_trial_to_run(&views, can_add)? else { return Ok(None) };
        if i >= self.trials.paused.len() {
            return Ok(None);
        }
        let rec = self.trials.paused.remove(i);
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
            if let Some(rec) = self.trials.paused.iter_mut().find(|p| p.id == e.trial_id) {
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
        self.scheduler.forget(&rec.id);
        if let Err(e) = self.store.put_searcher(&self.searcher.save()) {
            tracing::warn!(error = %e, "could not save the searcher state");
        }
        self.commits.push_end(rec);
        Ok(())
    }
}
