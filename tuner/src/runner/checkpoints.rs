//! Checkpoints in the loop: which one a (re)starting trial gets, the
//! commit marker and `num_to_keep` after a commit, and the clean-up of what
//! a failed run or a crash left uncommitted.

use std::collections::HashSet;
use std::path::PathBuf;

use trainer::Storage;

use super::{checkpoint_name, now_unix, Runner};
use crate::store::TrialRecord;
use crate::TuneError;

/// Deletes the checkpoints below `trial` (a trial's storage) whose names are
/// not in `keep` (the committed ones): what a failed run or a crash left
/// half written. Called only while no run of the trial is writing there.
pub(crate) async fn remove_uncommitted(trial: &Storage, keep: &HashSet<String>) -> Result<(), trainer::StorageError> {
    for uri in trial.list_checkpoints().await? {
        if !keep.contains(checkpoint_name(&uri)) {
            tracing::info!(checkpoint = %uri, "deleting an uncommitted checkpoint");
            if let Err(e) = trial.delete_checkpoint(&uri).await {
                tracing::warn!(checkpoint = %uri, error = %e, "could not delete an uncommitted checkpoint");
            }
        }
    }
    Ok(())
}

impl Runner {
    /// The checkpoint a (re)starting trial must fetch from an object store
    /// first (`None`: none, or local); an error when its checkpoint cannot
    /// serve this trial's number of workers.
    pub(super) fn checkpoint_to_fetch(&self, record: &TrialRecord) -> Result<Option<String>, String> {
        let Some(c) = &record.latest_checkpoint else { return Ok(None) };
        let workers = self.request.workers.len().max(1) as u32;
        if let Some(need) = c.required_world_size() {
            if need != workers {
                return Err(format!(
                    "checkpoint {} holds the shards of {need} ranks ({}), but the trial now runs {workers} worker(s); \
                     restore it with trainer.num_workers = {need}",
                    c.uri,
                    c.ranks.iter().map(|r| format!("rank-{r}")).collect::<Vec<_>>().join(", ")
                ));
            }
        }
        Ok(if self.storage.is_local() { None } else { Some(c.uri.clone()) })
    }

    /// A local checkpoint's directory, found by name in the trial's
    /// directory (wherever the experiment now is).
    pub(super) fn local_checkpoint(&self, record: &TrialRecord) -> Option<PathBuf> {
        let trial_dir = self.trial_dir(&record.id);
        record.latest_checkpoint.as_ref().map(|c| trial_dir.join(checkpoint_name(&c.uri)))
    }

    /// What `remove_uncommitted` needs for `trial_id`: its storage and the
    /// names of its committed checkpoints.
    pub(super) fn cleanup(&self, trial_id: &str) -> Result<(Storage, HashSet<String>), TuneError> {
        let keep = self.store.checkpoints(trial_id)?.iter().map(|c| checkpoint_name(&c.uri).to_string()).collect();
        Ok((self.storage.join(&format!("trials/{trial_id}")), keep))
    }

    /// After a checkpoint of `trial_id` is durable: marks it committed for
    /// other tools and applies `num_to_keep` (the records go first, durably;
    /// then the files).
    pub(super) fn after_commit(&mut self, trial_id: &str, uri: &str, iteration: u64) -> Result<(), TuneError> {
        let marker = serde_json::json!({ "trial_id": trial_id, "training_iteration": iteration, "committed_at": now_unix() });
        while self.background.try_join_next().is_some() {}
        let (storage, at) = (self.storage.clone(), uri.to_string());
        self.background.spawn(async move {
            if let Err(e) = storage.mark_committed(&at, marker.to_string().into_bytes()).await {
                tracing::warn!(checkpoint = %at, error = %e, "could not write the commit marker");
            }
        });
        self.apply_retention(trial_id)
    }

    /// Applies `num_to_keep` to `trial_id`'s committed checkpoints, sparing
    /// those pinned while an exploit copies them (they go at the next turn).
    pub(super) fn apply_retention(&mut self, trial_id: &str) -> Result<(), TuneError> {
        let Some(keep) = self.checkpoint.num_to_keep else { return Ok(()) };
        let committed = self.store.checkpoints(trial_id)?;
        let mut doomed =
            crate::retention::doomed(&committed, keep, self.checkpoint.score_attribute.as_deref(), self.checkpoint.score_order);
        doomed.retain(|c| !self.pinned.contains_key(&c.uri));
        if doomed.is_empty() {
            return Ok(());
        }
        for c in &doomed {
            self.store.remove_checkpoint(trial_id, c.iteration)?;
        }
        self.store.flush()?;
        for c in doomed {
            let storage = self.storage.clone();
            self.background.spawn(async move {
                if let Err(e) = storage.delete_checkpoint(&c.uri).await {
                    tracing::warn!(checkpoint = %c.uri, error = %e, "could not delete a checkpoint beyond num_to_keep");
                }
            });
        }
        Ok(())
    }
}
