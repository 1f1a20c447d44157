//! Checkpoints in the loop: which one a (re)starting trial gets, the
//! commit marker and `num_to_keep` after a commit, and the clean-up of what
//! a failed run or a crash left uncommitted.

use futures_util::future::{BoxFuture, FutureExt, Shared};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use trainer::Storage;

use crate::clock::now_unix;
use crate::config::CheckpointConfig;
use crate::store::{Store, TrialRecord};
use crate::text::checkpoint_name;
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
struct Background {
    tasks: tokio::task::JoinSet<()>,
    tails: HashMap<String, Shared<BoxFuture<'static, ()>>>,
}

impl Background {
    /// Queues `work` on `trial`'s files, after its jobs queued so far.
    fn spawn(&mut self, trial: &str, work: impl Future<Output = ()> + Send + 'static) {
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
    fn settled(&self, trial: &str) -> impl Future<Output = ()> + Send + 'static {
        let tail = self.tails.get(trial).filter(|t| t.peek().is_none()).cloned();
        async move {
            if let Some(tail) = tail {
                tail.await;
            }
        }
    }

    /// Waits for every job.
    async fn drain(&mut self) {
        while self.tasks.join_next().await.is_some() {}
        self.tails.clear();
    }
}

/// The sweep's checkpoint files as the loop handles them: where they
/// live, the file work queued per trial (commit markers, deletions), the
/// donor checkpoints pinned while exploits copy them, and `num_to_keep`.
pub(crate) struct Checkpoints {
    storage: Storage,
    /// `num_to_keep` and how checkpoints are ranked.
    retention: CheckpointConfig,
    /// Commit markers and deletions under way, per trial; the sweep ends after them.
    background: Background,
    /// Donor checkpoints being copied, kept from `num_to_keep` until done.
    pinned: HashMap<String, usize>,
}

impl Checkpoints {
    pub(crate) fn new(storage: Storage, retention: CheckpointConfig) -> Self {
        Self { storage, retention, background: Background::default(), pinned: HashMap::new() }
    }

    /// The experiment's storage.
    pub(crate) fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Where `trial_id`'s checkpoints go.
    pub(crate) fn of_trial(&self, trial_id: &str) -> Storage {
        self.storage.join(&format!("trials/{trial_id}"))
    }

    /// The checkpoint a (re)starting trial must fetch from an object store
    /// first (`None`: none, or local); an error when its checkpoint cannot
    /// serve `workers` workers.
    pub(crate) fn to_fetch(&self, record: &TrialRecord, workers: u32) -> Result<Option<String>, String> {
        let Some(c) = &record.latest_checkpoint else { return Ok(None) };
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

    /// What `remove_uncommitted` needs for `trial_id`: its storage and the
    /// names of its committed checkpoints.
    pub(crate) fn cleanup(&self, store: &Store, trial_id: &str) -> Result<(Storage, HashSet<String>), TuneError> {
        let keep = store.checkpoints(trial_id)?.iter().map(|c| checkpoint_name(&c.uri).to_string()).collect();
        Ok((self.of_trial(trial_id), keep))
    }

    /// After a checkpoint of `trial_id` is durable: marks it committed for
    /// other tools and applies `num_to_keep` (the records go first, durably;
    /// then the files).
    pub(crate) fn committed(&mut self, store: &Store, trial_id: &str, uri: &str, iteration: u64) -> Result<(), TuneError> {
        let marker = serde_json::json!({ "trial_id": trial_id, "training_iteration": iteration, "committed_at": now_unix() });
        let (storage, at) = (self.storage.clone(), uri.to_string());
        self.background.spawn(trial_id, async move {
            tracing::debug!(checkpoint = %at, "writing the commit marker");
            if let Err(e) = storage.mark_committed(&at, marker.to_string().into_bytes()).await {
                tracing::warn!(checkpoint = %at, error = %e, "could not write the commit marker");
            }
        });
        self.apply_retention(store, trial_id)
    }

    /// Applies `num_to_keep` to `trial_id`'s committed checkpoints, sparing
    /// those pinned while an exploit copies them (they go when unpinned).
    pub(crate) fn apply_retention(&mut self, store: &Store, trial_id: &str) -> Result<(), TuneError> {
        let Some(keep) = self.retention.num_to_keep else { return Ok(()) };
        let committed = store.checkpoints(trial_id)?;
        let mut doomed = crate::retention::doomed(&committed, keep, self.retention.score_attribute.as_deref(), self.retention.score_order);
        doomed.retain(|c| !self.pinned.contains_key(&c.uri));
        if doomed.is_empty() {
            return Ok(());
        }
        for c in &doomed {
            store.remove_checkpoint(trial_id, c.iteration)?;
        }
        store.flush_local()?;
        for c in doomed {
            let storage = self.storage.clone();
            self.background.spawn(trial_id, async move {
                tracing::debug!(checkpoint = %c.uri, "deleting a checkpoint beyond num_to_keep");
                if let Err(e) = storage.delete_checkpoint(&c.uri).await {
                    tracing::warn!(checkpoint = %c.uri, error = %e, "could not delete a checkpoint beyond num_to_keep");
                }
            });
        }
        Ok(())
    }

    /// Whether an exploit is copying `uri`.
    pub(crate) fn is_pinned(&self, uri: &str) -> bool {
        self.pinned.contains_key(uri)
    }

    /// Keeps `uri` from `num_to_keep` while an exploit copies it.
    pub(crate) fn pin(&mut self, uri: &str) {
        *self.pinned.entry(uri.to_string()).or_insert(0) += 1;
    }

    /// A copy of `uri` (a checkpoint of `donor_trial`) is done, failed or
    /// abandoned: `num_to_keep` applies to it again.
    pub(crate) fn unpin(&mut self, store: &Store, donor_trial: &str, uri: &str) -> Result<(), TuneError> {
        if let Some(n) = self.pinned.get_mut(uri) {
            *n -= 1;
            if *n == 0 {
                self.pinned.remove(uri);
            }
        }
        self.apply_retention(store, donor_trial)
    }

    /// Queues `work` on `trial`'s files, after its jobs queued so far.
    pub(crate) fn spawn(&mut self, trial: &str, work: impl Future<Output = ()> + Send + 'static) {
        self.background.spawn(trial, work);
    }

    /// Resolves once every job queued on `trial`'s files so far is done.
    pub(crate) fn settled(&self, trial: &str) -> impl Future<Output = ()> + Send + 'static {
        self.background.settled(trial)
    }

    /// Waits for every queued job.
    pub(crate) async fn drain(&mut self) {
        self.background.drain().await;
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
