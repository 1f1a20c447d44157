//! Opening an experiment's state for its loop: a new experiment's store
//! (the resolved file written beside it), or a resumed one's, squared with
//! what the scheduler's journal holds (trials added or ended after it,
//! results it never saw, decisions whose runs never exited) and cleared of
//! checkpoints a crash left uncommitted.

use std::collections::VecDeque;
use std::path::Path;

use schedulers::{Scheduler, TrialView};
use search::Searcher;
use trainer::Storage;

use crate::experiment::ExperimentFile;
use crate::journal::Journaled;
use crate::runner::view;
use crate::store::{Store, TrialRecord};
use crate::TuneError;

/// An experiment's state, ready for its loop.
pub(crate) struct Opened {
    pub store: Store,
    /// The scheduler, each of its hook calls journaled.
    pub scheduler: Journaled,
    /// Trials to (re)start before asking the searcher, oldest first.
    pub pending: VecDeque<TrialRecord>,
    /// PAUSED trials, oldest first.
    pub paused: Vec<TrialRecord>,
    /// Index of the next trial to create.
    pub next_index: u64,
    /// Trials already TERMINATED and ERROR.
    pub finished: (u64, u64),
    /// What the opening wrote is not yet durable: the loop's first group commit makes it so.
    pub unflushed: bool,
}

/// What a restored sweep does with its trials in ERROR.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Errored {
    /// They stay in ERROR.
    #[default]
    Keep,
    /// They run on from their latest committed checkpoint (Ray's `resume_errored`).
    Resume,
    /// They run again from the start, their results and checkpoints deleted (Ray's `restart_errored`).
    Restart,
}

/// A new experiment in `exp_dir`: refused when it has a store already,
/// unless that store never began (see [`never_began`]). The resolved file
/// is written beside the store (and beside the checkpoints, when they go
/// to an object store), with the searcher's first state. On this machine's
/// disk that is made durable by the loop's first group commit, off the
/// loop, while the first trials start: nothing is acknowledged before it.
pub(crate) async fn create(
    exp_dir: &Path,
    storage: &Storage,
    file: &ExperimentFile,
    searcher: &dyn Searcher,
    scheduler: Box<dyn Scheduler>,
    journal: bool,
) -> Result<Opened, TuneError> {
    let store_dir = exp_dir.join("store");
    if store_dir.exists() {
        if !never_began(&store_dir) {
            return Err(TuneError::Exists(exp_dir.to_path_buf()));
        }
        tracing::info!("{} holds a store a sweep stopped before its first commit: it is made anew", exp_dir.display());
        std::fs::remove_dir_all(&store_dir).map_err(|source| TuneError::Io { path: store_dir.clone(), source })?;
    }
    std::fs::create_dir_all(exp_dir).map_err(|source| TuneError::Io { path: exp_dir.to_path_buf(), source })?;
    make_private(exp_dir, file.experiment.group_readable)?;
    let text = file.to_toml_string();
    std::fs::write(exp_dir.join("experiment.toml"), &text)
        .map_err(|source| TuneError::Io { path: exp_dir.join("experiment.toml"), source })?;
    let store = Store::open(&store_dir)?;
    store.put_experiment(&text)?;
    store.put_searcher(&searcher.save())?;
    if !storage.is_local() {
        // Mirrored from a durable start.
        store.flush()?;
        // Beside the checkpoints, for tools that only see the bucket; and the store, mirrored from now on.
        storage.put_bytes("experiment.toml", text.into_bytes()).await.map_err(TuneError::Storage)?;
        store.mirror_to(&storage.join("store")).await?;
    }
    let scheduler = Journaled::new(scheduler, &store, journal);
    let unflushed = storage.is_local();
    Ok(Opened { store, scheduler, pending: VecDeque::new(), paused: Vec::new(), next_index: 0, finished: (0, 0), unflushed })
}

/// Whether the store at `store_dir` is one a sweep left before its first
/// group commit made it durable: it opens (no live driver holds it) and
/// holds nothing at all (or it has not even sled's files). Such a store
/// holds nothing that was ever acknowledged, and a new sweep may take its
/// place. A store that does not open, or holds anything, is never taken
/// for one.
pub(crate) fn never_began(store_dir: &Path) -> bool {
    matches!(open_begun(store_dir), Ok(None))
}

/// The store at `store_dir`, open, unless it is one a sweep left before
/// its first commit ([`never_began`]): `None` then.
pub(crate) fn open_begun(store_dir: &Path) -> Result<Option<Store>, crate::store::StoreError> {
    match Store::open_existing(store_dir) {
        // The experiment is written first: a store without it that holds
        // anything else is not one a crash left, and is not taken.
        Ok(store) if store.holds_nothing()? => Ok(None),
        Ok(store) => Ok(Some(store)),
        // Its directory, but not even sled's files: stopped as it was being made.
        Err(crate::store::StoreError::Missing(_)) if store_dir.is_dir() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Makes the experiment's directory its owner's alone (0700), or its
/// group's to read too (0750): what is below it (logs, the pickled training
/// function, checkpoints) is then out of other users' reach, whatever
/// modes its files were written with.
pub(crate) fn make_private(exp_dir: &Path, group_readable: bool) -> Result<(), TuneError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = if group_readable { 0o750 } else { 0o700 };
    std::fs::set_permissions(exp_dir, std::fs::Permissions::from_mode(mode))
        .map_err(|source| TuneError::Io { path: exp_dir.to_path_buf(), source })
}

/// The experiment whose store is `store_dir`, as it was left: the searcher
/// restored, the scheduler from its journal and squared with the store,
/// unfinished trials pending (PAUSED ones paused), and the checkpoints a
/// crash left uncommitted deleted before any trial runs again. Trials in
/// ERROR run again when `errored` says so.
pub(crate) async fn resume(
    store_dir: &Path,
    storage: &Storage,
    searcher: &mut dyn Searcher,
    scheduler: Box<dyn Scheduler>,
    journal: bool,
    errored: Errored,
) -> Result<Opened, TuneError> {
    let mut pending = VecDeque::new();
    let mut paused = Vec::new();
    let mut next_index = 0;
    let mut finished = (0, 0);
    let store = if storage.is_local() {
        Store::open_existing(store_dir)?
    } else {
        // The bucket's copy is the store of record: every acknowledged result is there. A local store
        // that is behind it (another machine went on) or was never mirrored gives way to it.
        let mirrored = storage.join("store");
        let bucket = Store::mirror_next(&mirrored).await.map_err(TuneError::Storage)?;
        let store = if bucket > 0 && Store::mirrored_seq(store_dir) != Some(bucket - 1) {
            Store::materialize(&mirrored, store_dir).await?
        } else {
            Store::open_existing(store_dir)?
        };
        store.mirror_to(&mirrored).await?;
        store
    };
    if let Some(n) = store.meta(crate::runner::keep::LET_GO)?.and_then(|v| v.as_u64()) {
        return Err(TuneError::Corrupt(
            store_dir.to_path_buf(),
            format!("a simulation that kept only its best trials (it let go of {n}) cannot be resumed; run it again"),
        ));
    }
    store.recover_created()?;
    if let Some(state) = store.searcher()? {
        searcher.restore(&state)?;
    }
    // The scheduler's latest snapshot, and the calls made after it.
    let mut scheduler = Journaled::resume(scheduler, &store, journal)?;
    let trials = store.trials()?;
    // Trials created after the journal ends (the driver died before the
    // flush that would have written their `on_trial_add`), in creation order.
    if let Some(added) = scheduler.added() {
        for t in trials.iter().filter(|t| t.index >= added) {
            let created = TrialView { status: schedulers::TrialStatus::Pending, num_results: 0, ..view(t) };
            scheduler.on_trial_add(&created)?;
        }
    }
    // Trials that ended after the journal ends: ended for the scheduler too (below).
    let mut ended = Vec::new();
    for mut t in trials {
        if t.status == schedulers::TrialStatus::Error && errored != Errored::Keep {
            revive(&store, store_dir, &mut t, errored)?;
            // The scheduler ended it; it joins again.
            scheduler.on_trial_add(&view(&t))?;
        }
        if !t.status.is_finished() {
            store.refresh_trial(&mut t)?;
        } else if scheduler.is_live(&t.id) {
            ended.push(t.clone());
        }
        next_index = next_index.max(t.index + 1);
        match t.status {
            schedulers::TrialStatus::Terminated => finished.0 += 1,
            schedulers::TrialStatus::Error => finished.1 += 1,
            schedulers::TrialStatus::Paused => paused.push(t),
            _ => pending.push_back(t),
        }
    }
    let mut lists = TrialLists { pending: &mut pending, paused: &mut paused, finished: &mut finished };
    replay_unseen(&store, &mut scheduler, searcher, &mut lists)?;
    for t in &ended {
        if t.status == schedulers::TrialStatus::Error {
            scheduler.on_trial_error(&view(t))?;
        } else {
            scheduler.on_trial_complete(&view(t), t.last_result.as_ref())?;
        }
    }
    // Checkpoints a crash left uncommitted (half uploaded, or beyond
    // num_to_keep but not yet deleted) go before any trial runs again.
    collect_garbage(&store, storage).await?;
    Ok(Opened { store, scheduler, pending, paused, next_index, finished, unflushed: false })
}

/// A trial in ERROR made PENDING again: from its latest committed
/// checkpoint, or from the start with its results and checkpoints deleted
/// (their files go with the uncommitted ones, below).
fn revive(store: &Store, store_dir: &Path, t: &mut crate::store::TrialRecord, errored: Errored) -> Result<(), TuneError> {
    if errored == Errored::Restart {
        store.clear_series(&t.id)?;
        // Its files for people start over with it.
        let trial_dir = store_dir.parent().unwrap_or(store_dir).join("trials").join(&t.id);
        for name in ["result.jsonl", "progress.csv"] {
            let path = trial_dir.join(name);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(TuneError::Io { path, source }),
            }
        }
        t.num_results = 0;
        t.last_result = None;
        t.latest_checkpoint = None;
        t.time_total_s = 0.0;
    }
    t.status = schedulers::TrialStatus::Pending;
    t.error = None;
    t.ended_at = None;
    t.failures = 0;
    store.put_trial(t)?;
    Ok(())
}

/// The trials of a resumed sweep, by what happens to them next.
struct TrialLists<'a> {
    pending: &'a mut VecDeque<crate::store::TrialRecord>,
    paused: &'a mut Vec<crate::store::TrialRecord>,
    finished: &'a mut (u64, u64),
}

/// What the resume hands the scheduler, or carries out for it, in the
/// order the sweep met them.
enum Catch {
    /// A stored result its journal does not hold.
    Unseen(search::TrialResult),
    /// A decision it made (and journaled) on a trial whose run never exited.
    Decided(schedulers::Decision),
}

/// Squares the scheduler with what the store holds beyond its journal, in
/// the order it was stored:
/// - results stored after what its journal holds (the driver died between
///   a result's flush and the journal's) are fed to it, and its decisions
///   applied (a PAUSED trial with such results is decided on again, as if
///   running);
/// - decisions it made whose runs never exited (the driver died in
///   between) are carried out.
///
/// Either way as the sweep would have: a trial it stops ends TERMINATED,
/// one it pauses is PAUSED, an exploit or a resize is carried out before
/// the trial runs again.
fn replay_unseen(
    store: &Store,
    scheduler: &mut Journaled,
    searcher: &mut dyn Searcher,
    lists: &mut TrialLists<'_>,
) -> Result<(), TuneError> {
    use schedulers::{Decision, TrialStatus};
    let at = |r: &search::TrialResult| r.metrics.get("timestamp").copied().unwrap_or(0.0);
    let mut catches = Vec::new();
    for t in lists.pending.iter().chain(lists.paused.iter()) {
        let from = scheduler.seen(&t.id);
        for r in store.results(&t.id)?.into_iter().filter(|r| r.seq >= from) {
            catches.push((at(&r), t.id.clone(), r.seq, Catch::Unseen(r)));
        }
    }
    let deciding: std::collections::HashSet<String> = catches.iter().map(|c| c.1.clone()).collect();
    for t in lists.pending.iter_mut() {
        match t.decided.take() {
            // Decided on a result the journal does not hold: decided again below.
            Some(_) if deciding.contains(&t.id) => store.put_trial(t)?,
            Some(d) => {
                let when = t.last_result.as_ref().map_or(0.0, at);
                catches.push((when, t.id.clone(), t.num_results, Catch::Decided(d)));
            }
            None => {}
        }
    }
    let (again, still): (Vec<_>, Vec<_>) = std::mem::take(lists.paused).into_iter().partition(|t| deciding.contains(&t.id));
    *lists.paused = still;
    lists.pending.extend(again);
    catches.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    for (_, id, _, catch) in catches {
        let Some(i) = lists.pending.iter().position(|t| t.id == id) else { continue };
        let (decision, result) = match catch {
            Catch::Unseen(r) => {
                tracing::info!(trial = %r.trial_id, iteration = r.training_iteration, "replaying a result the scheduler had not seen");
                let decision = scheduler.on_trial_result(&view(&lists.pending[i]), &r)?;
                searcher.on_trial_result(&r.trial_id, &r);
                (decision, Some(r))
            }
            Catch::Decided(d) => {
                tracing::info!(trial = %id, "carrying out a decision its run did not live to see: {d:?}");
                let last = lists.pending[i].last_result.clone();
                (d, last)
            }
        };
        match decision {
            Decision::Continue => continue,
            Decision::Exploit(e) => {
                // Carried out before the trial runs again.
                lists.pending[i].pending_exploit = Some(*e);
                store.put_trial(&lists.pending[i])?;
                continue;
            }
            Decision::Resize { num_workers } => {
                // It restarts anyway: with the new size, when its latest checkpoint is the one decided on and fits.
                let t = &mut lists.pending[i];
                let fits = t
                    .latest_checkpoint
                    .as_ref()
                    .filter(|c| result.as_ref().is_some_and(|r| Some(&c.uri) == r.checkpoint.as_ref()))
                    .is_some_and(|c| c.required_world_size().is_none_or(|n| n == num_workers));
                if fits {
                    t.num_workers = Some(num_workers);
                    t.resizing = true;
                    t.resizes += 1;
                }
                store.put_trial(t)?;
                continue;
            }
            Decision::Pause | Decision::Stop => {}
        }
        let Some(mut t) = lists.pending.remove(i) else { continue };
        if decision == Decision::Pause {
            t.status = TrialStatus::Paused;
            store.put_trial(&t)?;
            searcher.on_trial_pause(&t.id);
            let at = lists.paused.partition_point(|p| p.index < t.index);
            lists.paused.insert(at, t);
        } else {
            t.status = TrialStatus::Terminated;
            t.ended_at = Some(crate::clock::now_unix());
            store.put_trial(&t)?;
            scheduler.on_trial_complete(&view(&t), t.last_result.as_ref())?;
            searcher.on_trial_complete(&t.id, t.last_result.as_ref(), false);
            lists.finished.0 += 1;
        }
    }
    scheduler.release();
    store.flush()?;
    Ok(())
}

/// Deletes every checkpoint in storage that the store does not hold as
/// committed. Checkpoints are matched by name within their trial, so an
/// experiment directory that moved keeps its checkpoints.
async fn collect_garbage(store: &Store, storage: &Storage) -> Result<(), TuneError> {
    use futures_util::{StreamExt, TryStreamExt};
    let committed = store.all_checkpoints()?;
    let trials = store.trials()?;
    // One listing per trial, several at once: an object store answers each in milliseconds.
    let sweeps = trials.iter().map(|t| {
        let trial = storage.join(&format!("trials/{}", t.id));
        let keep: std::collections::HashSet<String> =
            committed.get(&t.id).into_iter().flatten().map(|c| crate::text::checkpoint_name(&c.uri).to_string()).collect();
        async move { crate::runner::remove_uncommitted(&trial, &keep).await.map_err(TuneError::Storage) }
    });
    futures_util::stream::iter(sweeps).buffer_unordered(16).try_collect::<Vec<()>>().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use schedulers::{Decision, Exploit, Fifo, TrialStatus};
    use search::{BasicVariantGenerator, Domain, Space, TrialResult};

    use super::*;

    /// A run that got its decision and died with the driver before it
    /// exited: its record says what was decided; the resume carries it out
    /// without asking the scheduler again (its journal holds the call).
    #[test]
    fn a_decision_whose_run_never_exited_is_carried_out_on_resume() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let mut scheduler = Journaled::new(Box::new(Fifo), &store, true);
        let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
        let mut searcher = BasicVariantGenerator::new(space, 4, 0);
        let exploit = Exploit {
            trial_id: "t2".into(),
            donor: "t0".into(),
            checkpoint: "c".into(),
            checkpoint_iteration: 1,
            config: serde_json::json!({ "x": 0.5 }),
        };
        let decided = [Some(Decision::Pause), Some(Decision::Stop), Some(Decision::Exploit(Box::new(exploit.clone()))), None];
        let mut pending = VecDeque::new();
        for (i, d) in decided.into_iter().enumerate() {
            let mut t = TrialRecord::new(format!("t{i}"), i as u64, serde_json::json!({ "x": 0.1 }), 0.0);
            scheduler.on_trial_add(&view(&t)).unwrap();
            t.status = TrialStatus::Running;
            let r = TrialResult {
                extra: None,
                trial_id: t.id.clone(),
                seq: 0,
                training_iteration: 1,
                metrics: [("loss".to_string(), 1.0), ("timestamp".to_string(), i as f64)].into_iter().collect(),
                checkpoint: None,
            };
            store.put_result(&r).unwrap();
            assert_eq!(scheduler.on_trial_result(&view(&t), &r).unwrap(), Decision::Continue);
            t.num_results = 1;
            t.last_result = Some(r);
            t.decided = d;
            store.put_trial(&t).unwrap();
            // Resumed, a trial that was running is pending.
            t.status = TrialStatus::Pending;
            pending.push_back(t);
        }
        let (mut paused, mut finished) = (Vec::new(), (0, 0));
        let mut lists = TrialLists { pending: &mut pending, paused: &mut paused, finished: &mut finished };
        replay_unseen(&store, &mut scheduler, &mut searcher, &mut lists).unwrap();
        assert_eq!(paused.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["t0"]);
        assert_eq!(store.trial("t0").unwrap().unwrap().status, TrialStatus::Paused);
        assert_eq!(finished, (1, 0));
        assert_eq!(store.trial("t1").unwrap().unwrap().status, TrialStatus::Terminated);
        assert!(!scheduler.is_live("t1"), "the scheduler is told it completed");
        assert_eq!(pending.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["t2", "t3"]);
        assert_eq!(pending[0].pending_exploit, Some(exploit), "carried out before it runs again");
        assert_eq!(store.trial("t2").unwrap().unwrap().decided, None);
        assert!(pending.iter().all(|t| t.decided.is_none()));
        assert!(["t0", "t2", "t3"].iter().all(|t| scheduler.seen(t) == 1), "no result fed twice");
    }
}
