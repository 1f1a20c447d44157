//! Checkpoints in the loop: which one a (re)starting trial gets, the
//! commit marker and `num_to_keep` after a commit, and the clean-up of what
//! a failed run or a crash left uncommitted.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;

use futures_util::future::{BoxFuture, FutureExt, Shared};
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

/// File work off the loop (commit markers, deletions), queued per trial:
/// one trial's jobs run in the order given, and a trial about to run again
/// waits for its own (`settled`), so a late deletion or marker never lands
/// on a checkpoint written anew under the same name.
#[derive(Default)]
pub(crate) struct Background {
    tasks: tokio::task::JoinSet<()>,
    tails: HashMap<String, Shared<BoxFuture<'static, ()>>>,
}

impl Background {
    /// Queues `work` on `trial`'s files, after its jobs queued so far.
    pub(crate) fn spawn(&mut self, trial: &str, work: impl Future<Output = ()> + Send + 'static) {
        while self.tasks.try_join_next().is_some() {}
        let before = self.tails.remove(trial).filter(|t| t.peek().is_none());
        let job = async move {
            if let Some(before) = before {
                before.await;
            }
            work.await;
        }
        .boxed()
        .shared();
        self.tasks.spawn(job.clone());
        self.tails.insert(trial.to_string(), job);
    }

    /// Resolves once every job queued on `trial`'s files so far is done.
    pub(crate) fn settled(&self, trial: &str) -> impl Future<Output = ()> + Send + 'static {
        let tail = self.tails.get(trial).filter(|t| t.peek().is_none()).cloned();
        async move {
            if let Some(tail) = tail {
                tail.await;
            }
        }
    }

    /// Waits for every job.
    pub(crate) async fn drain(&mut self) {
        while self.tasks.join_next().await.is_some() {}
        self.tails.clear();
    }
}

impl Runner {
    /// The checkpoint a (re)starting trial must fetch from an object store
    /// first (`None`: none, or local); an error when its checkpoint cannot
    /// serve this trial's number of workers.
    pub(super) fn checkpoint_to_fetch(&self, record: &TrialRecord) -> Result<Option<String>, String> {
        let Some(c) = &record.latest_checkpoint else { return Ok(None) };
        let workers = self.request_for(record).workers.len().max(1) as u32;
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
        let (storage, at) = (self.storage.clone(), uri.to_string());
        self.background.spawn(trial_id, async move {
            if let Err(e) = storage.mark_committed(&at, marker.to_string().into_bytes()).await {
                tracing::warn!(checkpoint = %at, error = %e, "could not write the commit marker");
            }
        });
        self.apply_retention(trial_id)
    }

    /// Applies `num_to_keep` to `trial_id`'s committed checkpoints, sparing
    /// those pinned while an exploit copies them (they go at the next turn).
    pub(super) fn apply_retention(&mut self, trial_id: &str) -> Result<(), TuneError> {
        let Some(keep) = self.settings.checkpoint.num_to_keep else { return Ok(()) };
        let committed = self.store.checkpoints(trial_id)?;
        let mut doomed = crate::retention::doomed(
            &committed,
            keep,
            self.settings.checkpoint.score_attribute.as_deref(),
            self.settings.checkpoint.score_order,
        );
        doomed.retain(|c| !self.trials.pinned.contains_key(&c.uri));
        if doomed.is_empty() {
            return Ok(());
        }
        for c in &doomed {
            self.store.remove_checkpoint(trial_id, c.iteration)?;
        }
        self.store.flush()?;
        for c in doomed {
            let storage = self.storage.clone();
            self.background.spawn(trial_id, async move {
                if let Err(e) = storage.delete_checkpoint(&c.uri).await {
                    tracing::warn!(checkpoint = %c.uri, error = %e, "could not delete a checkpoint beyond num_to_keep");
                }
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::Background;

    /// One trial's jobs run in order, and `settled` waits for all of them;
    /// another trial's jobs do not wait on them.
    #[tokio::test]
    async fn a_trials_file_jobs_run_in_order_and_settle_together() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut bg = Background::default();
        let job = |name: &'static str, ms: u64| {
            let log = Arc::clone(&log);
            async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                log.lock().unwrap().push(name);
            }
        };
        bg.spawn("a", job("a1", 60));
        bg.spawn("a", job("a2", 0));
        bg.spawn("b", job("b1", 0));
        bg.settled("b").await;
        assert_eq!(*log.lock().unwrap(), vec!["b1"]);
        bg.settled("a").await;
        assert_eq!(*log.lock().unwrap(), vec!["b1", "a1", "a2"]);
        bg.spawn("a", job("a3", 0));
        bg.drain().await;
        assert_eq!(log.lock().unwrap().len(), 4);
    }
}
